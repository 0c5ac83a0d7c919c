#!/usr/bin/env python3
"""The many-node emulator (issue 20, item 4): the real peer code on hundreds of nodes.

Each emulated node is one light process (``node.py``: the agent's peer server, client and
swarm logic, real TCP; no slurmd, no FUSE, no agent) in a network namespace of its own
behind its own tc-capped link (``swarmnet.py``, slurm-dev's network made wide); the store
(``store.py``, HTTP) sits behind a link 10x slower than a node's. All nodes start at once
and fetch the job's whole piece set; a run ends when every live node holds every piece.

Piece sets, shaped like the startup benchmark's job and scaled down in bytes (``--scale``):

- ``bench``: 232 hot image blocks (256 KiB), 8 snapshot frames (14 MiB in all), 32
  checkpoint units (4 MiB): 272 pieces, 200 MiB before scaling;
- ``10x``: ten times as many of each (2,720 pieces, 2,000 MiB before scaling).

Faults: ``none``; ``dead5`` (5% of the nodes' agents down: connection refused);
``slow5`` (5% of the nodes on a link of a tenth of the others'); ``corrupt1`` (1% of the
nodes serve a byte flipped in every piece).

One JSON record per run, with the issue's fields: ``engine``, ``nodes``, ``pieces``,
``piece_bytes``, ``all_hold_s``, ``store_egress_bytes`` (the store link's counter),
``max_node_upload_bytes`` (the busiest node's link, what it sent), ``max_open_connections``
(peer connections open at once on any node, either way: the most it kept open to peers
or served, sampled every 0.2 s from the kernel's table), ``handshakes_per_node``
(connections a node set up and authenticated, the most of any node), ``cpu_s_per_node``
(mean over the live nodes, the whole run), ``faults``, ``load1``.

    bench.py --smoke --json OUT    # 16 and 64 nodes, a quarter of the pieces (tests/slurmdev)
    bench.py --nodes 16,64 --faults none,dead5,slow5,corrupt1 --json OUT
    bench.py --nodes 16,128,256 --store-mbit 0.1 --json OUT   # 256 on 2 shared cores
    bench.py --engine tree,libtorrent --nodes 16,64 --json OUT  # the engines alternating
    bench.py --engine main=/tmp/main/lib,tree --json OUT  # main's peer code against this one

Engines: ``tree`` (or any label: the peer code of this checkout or ``SWARM_LIB``, run by
``node.py``; ``LABEL=DIR``: the peer code of ``DIR``, another checkout's ``lib/``) and
``libtorrent`` (``node_lt.py``: a libtorrent session per node, the piece set as one v2
torrent, the store its web seed; needs ``libtorrent`` in the python that runs this, the
``bench`` extra: ``pip install -e '.[bench]'``). Several, comma-separated, run one after
another for each size and fault, on the same network and store.

``--run-blocks 32`` has the image blocks asked as the agent's prefetch asks them: in runs,
up to 32 blocks (``prefetch_run_kib`` 8 MiB of 256 KiB blocks) of one peer's in one request;
0 (the default, as every result before it) asks block by block.

``--store-mbit`` (nodes 10x it) sets the emulator's time scale: every bound of the
agent's and its heartbeat are stretched by the same factor as the transfers
(``stretch``), so only the share of the machine's CPU a run takes changes. 256 nodes
need 0.1 Mbit/s on this 2-core machine: at 0.4 their CPU, squeezed into 4x less
time, starved processes past the silence bound (docs/p2p.md, "256 emulated nodes").
Each run is checked: every node holds every piece (read back, digests), and no node
had more peer connections open than ``--max-connections`` (the run fails otherwise).

Needs root (namespaces, tc) and bootseer importable (the venv's python). Everything it
starts is stopped by pid, and the network removed, also on failure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[2] / "lib"))

from swarmnet import SwarmNetwork, neigh_stats  # noqa: E402

from bootseer import digest  # noqa: E402
from bootseer.p2p.auth import job_token  # noqa: E402

KiB = 1 << 10
MiB = 1 << 20
STORE_PORT = 8080
PEER_PORT = 7460
JOB = 4242
TORRENT_NAME = "job"
LT_PIECE = 16 * KiB  # libtorrent's smallest piece (v2: a power of two >= 16 KiB)
FAULTS = ("none", "dead5", "slow5", "corrupt1")
FIELDS = (
    "engine", "nodes", "pieces", "piece_bytes", "all_hold_s", "store_egress_bytes",
    "max_node_upload_bytes", "max_open_connections", "handshakes_per_node",
    "cpu_s_per_node", "faults", "load1",
)  # fmt: skip


@dataclass(frozen=True)
class Kind:
    name: str
    count: int
    size: int  # bytes before scaling


def shape(name: str) -> list[Kind]:
    """The benchmark job's pieces (``bench``) or ten times as many of each (``10x``)."""
    if name == "smoke":  # a quarter of each, for the suite's time budget
        return [Kind("block", 58, 256 * KiB), Kind("frame", 2, 14 * MiB // 8),
                Kind("unit", 8, 4 * MiB)]  # fmt: skip
    k = {"bench": 1, "10x": 10}[name]
    return [
        Kind("block", 232 * k, 256 * KiB),
        Kind("frame", 8 * k, 14 * MiB // 8),
        Kind("unit", 32 * k, 4 * MiB),
    ]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def make_pieces(work: Path, kinds: list[Kind], scale: int) -> list[dict[str, Any]]:
    """Random bytes for every piece in one file (the store's), and the layout."""
    work.mkdir(parents=True, exist_ok=True)
    pieces: list[dict[str, Any]] = []
    offset = 0
    with open(work / "pieces", "wb") as f:
        for kind in kinds:
            size = max(1, kind.size // scale)
            for _ in range(kind.count):
                data = os.urandom(size)
                f.write(data)
                pieces.append(
                    {
                        "index": len(pieces),
                        "kind": kind.name,
                        "size": size,
                        "offset": offset,
                        "sha256": hashlib.sha256(data).hexdigest(),  # node_lt, older libs
                        "digest": digest.of(data),  # the name a lib since BLAKE3 uses
                    }
                )
                offset += size
    (work / "layout.json").write_text(json.dumps(pieces))
    return pieces


class Lines:
    """Every started process's stdout lines, on one queue: (name, line)."""

    def __init__(self) -> None:
        self.q: queue.Queue[tuple[str, str]] = queue.Queue()

    def follow(self, name: str, proc: subprocess.Popen[str]) -> None:
        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self.q.put((name, line.strip()))
            self.q.put((name, "<eof>"))

        threading.Thread(target=pump, daemon=True).start()

    def expect(
        self, names: set[str], word: str, timeout: float, partial: bool = False
    ) -> dict[str, str]:
        """The first line starting with ``word`` from each of ``names`` (``partial``: from
        those that said it within ``timeout``)."""
        got: dict[str, str] = {}
        deadline = time.monotonic() + timeout
        while len(got) < len(names):
            try:
                name, line = self.q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                if partial:
                    return got
                missing = sorted(names - set(got))
                raise RuntimeError(f"no {word!r} within {timeout:g}s from {missing[:8]}") from None
            if name not in names or name in got:
                continue
            if line == "<eof>" or line.startswith("failed"):
                raise RuntimeError(f"{name}: {line} (waiting for {word!r})")
            if line.startswith(word):
                got[name] = line
        return got


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def pick(nodes: list[str], share: float) -> list[str]:
    """ceil(share * N) nodes spread over the list (never the first: it is no special node)."""
    k = math.ceil(share * len(nodes))
    step = len(nodes) / k
    return [nodes[min(len(nodes) - 1, int(step * i + step / 2))] for i in range(k)]


def hold_quantiles(done: dict[str, str], t0: float) -> list[float]:
    ts = sorted(float(v.split()[1]) - t0 for v in done.values())
    at = lambda q: ts[min(len(ts) - 1, int(q * len(ts)))]  # noqa: E731
    return [round(x, 1) for x in (ts[0], at(0.5), at(0.9), ts[-1])]


def webseeds(nodes: list[str], k: int) -> list[str]:
    """The ``k`` nodes given the store as a web seed from the start, spread over the list
    from its first (0: every node)."""
    if k <= 0 or k >= len(nodes):
        return list(nodes)
    return [nodes[i * len(nodes) // k] for i in range(k)]


def make_torrent(work: Path, pieces: list[dict[str, Any]]) -> Path:
    """The ``libtorrent`` engine's torrent: one private v2 torrent (SHA-256 merkle, 16 KiB
    pieces) named ``job``, a file per kind of piece (its pieces' bytes in order), made
    from the store's bytes as image registration would."""
    try:
        import libtorrent as lt
    except ImportError as exc:
        raise SystemExit(
            f"bench.py: --engine libtorrent needs libtorrent in {sys.executable} ({exc}): "
            "pip install -e '.[bench]' into the venv (scripts/bootstrap installs [dev] only)"
        ) from exc

    root = work / "torrent" / TORRENT_NAME
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    with open(work / "store" / "pieces", "rb") as src:
        for p in pieces:
            with open(root / p["kind"], "ab") as f:
                f.write(os.pread(src.fileno(), p["size"], p["offset"]))
    # Each file a whole number of pieces (zeros after the last piece of a kind, as
    # store.py serves it): libtorrent 2.1.1 failed the hash of pieces a web seed sent
    # next to a v2 pad file and banned the web seed, every run of the 10x set.
    for f in root.iterdir():
        with open(f, "ab") as out:
            out.write(bytes(-f.stat().st_size % LT_PIECE))
    ct = lt.create_torrent(lt.list_files(str(root)), LT_PIECE, lt.create_torrent.v2_only)
    ct.set_priv(True)
    lt.set_piece_hashes(ct, str(root.parent))
    out = work / "torrent" / "job.torrent"
    out.write_bytes(lt.bencode(ct.generate()))
    shutil.rmtree(root)
    return out


def one_run(
    net: SwarmNetwork,
    n: int,
    pieces: list[dict[str, Any]],
    fault: str,
    a: argparse.Namespace,
    python: str,
    engine: str,
) -> dict[str, Any]:
    nodes = list(net.nodes[:n])
    dead = pick(nodes, 0.05) if fault == "dead5" else []
    slow = pick(nodes, 0.05) if fault == "slow5" else []
    corrupt = pick(nodes, 0.01) if fault == "corrupt1" else []
    live = [x for x in nodes if x not in dead]
    key = os.urandom(32)
    spec = {
        "job": JOB,
        "engine": engine,
        "nodes": nodes,
        "ips": {x: net.node_ip(x) for x in nodes},
        "port": PEER_PORT,
        "pieces": [
            {k: p[k] for k in ("index", "kind", "size", "sha256", "digest")} for p in pieces
        ],
        "store_ip": net.store_ip,
        "store_port": STORE_PORT,
        "site_key": key.hex(),
        "token": job_token(key, JOB).hex(),
        "max_connections": a.max_connections,
        "run_blocks": a.run_blocks.get(engine, 0),
        # The agent's bounds (30 s a piece, 10 s of silence, 30 s dropped) and its
        # heartbeat (1 s), stretched as the emulator stretches time: they keep their
        # ratio to the transfer times, and a node sends as many heartbeats per piece
        # as an agent on slurm-dev's links (at 1 s they were 15% of a node's CPU).
        "peer_timeout": 30.0 * a.stretch,
        "peer_silence": 10.0 * a.stretch,
        "dead_for": 30.0 * a.stretch,
        "heartbeat": 1.0 * a.stretch,
        # libtorrent: its torrent, the nodes given the web seed from the start, how long a
        # node gains no piece before it adds the web seed itself (the silence bound)
        "stretch": a.stretch,
        "torrent": str(a.torrent) if a.torrent else None,
        "torrent_name": TORRENT_NAME,
        "webseeds": webseeds(live, a.lt_webseeds),
        "fallback_s": 10.0 * a.stretch,
        # bytes/s a web-seeded node may upload: this many times its share of the store's
        # link (0: no limit), so that the pieces it takes from the store spread by relays
        "seed_slots": a.lt_seed_slots,
        "slots": a.lt_slots,
        "seed_upload_bps": int(
            a.lt_seed_upload * a.store_mbit * 1e6 / 8 / len(webseeds(live, a.lt_webseeds))
        ),
        "lt_settings": json.loads(os.environ.get("SWARM_LT_SETTINGS", "{}")),
    }
    run_dir = a.work / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    spec_path = run_dir / "spec.json"
    spec_path.write_text(json.dumps(spec))
    for x in slow:
        net.cap(x, a.node_mbit / 10)
    procs: dict[str, subprocess.Popen[str]] = {}
    lines = Lines()
    try:
        for x in live:
            script = "node_lt.py" if engine == "libtorrent" else "node.py"
            cmd = [*net.enter(x), python, str(a.code / script), "--spec", str(spec_path)]
            cmd += ["--name", x, "--dir", str(run_dir / x)]
            if x in corrupt:
                cmd.append("--corrupt")
            procs[x] = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                bufsize=1,
                env={**os.environ, "SWARM_LIB": str(a.libs.get(engine, a.code / "lib"))},
            )
            lines.follow(x, procs[x])
        lines.expect(set(live), "ready", a.timeout)
        egress0 = net.store_egress_bytes()
        neigh0 = neigh_stats()
        tx0 = {x: net.node_tx_bytes(x) for x in nodes}
        t0 = time.monotonic()
        for x in live:
            assert procs[x].stdin is not None
            procs[x].stdin.write("go\n")
            procs[x].stdin.flush()
        done = lines.expect(set(live), "done", a.run_timeout, partial=True)
        load1 = os.getloadavg()[0]
        neigh1 = neigh_stats()
        egress = net.store_egress_bytes() - egress0
        uploads = {x: net.node_tx_bytes(x) - tx0[x] for x in nodes}
        if len(done) < len(live):  # not finished in time: what the links say, no more
            record = {
                "engine": engine, "nodes": n, "pieces": len(pieces),
                "piece_bytes": sum(p["size"] for p in pieces), "all_hold_s": None,
                "store_egress_bytes": egress, "max_node_upload_bytes": max(uploads.values()),
                "max_open_connections": None, "handshakes_per_node": None,
                "cpu_s_per_node": None, "faults": fault, "load1": round(load1, 2),
            }  # fmt: skip
            log(f"run: {len(done)} of {len(live)} nodes done after {a.run_timeout:g}s: {record}")
            return record
        all_hold = max(float(v.split()[1]) for v in done.values()) - t0
        for x in live:
            assert procs[x].stdin is not None
            procs[x].stdin.write("stop\n")
            procs[x].stdin.flush()
        stats = {x: json.loads(v) for x, v in lines.expect(set(live), "{", a.timeout).items()}
    finally:
        for p in procs.values():
            stop(p)
        for x in slow:
            net.cap(x, a.node_mbit)
        shutil.rmtree(run_dir, ignore_errors=True)
    # A libtorrent liar (corrupt1) holds no good copy: it is checked by the others' pieces.
    liars = set(corrupt) if engine == "libtorrent" else set()
    short = {
        x: s["held_ok"] for x, s in stats.items() if s["held_ok"] != len(pieces) and x not in liars
    }
    if short:
        raise RuntimeError(f"nodes missing pieces (held of {len(pieces)}): {short}")
    busiest = max(uploads, key=uploads.__getitem__)
    record = {
        "engine": engine,
        "nodes": n,
        "pieces": len(pieces),
        "piece_bytes": sum(p["size"] for p in pieces),
        "all_hold_s": round(all_hold, 3),
        "store_egress_bytes": egress,
        "max_node_upload_bytes": uploads[busiest],
        "max_open_connections": max(max(s["max_out"], s["max_in"]) for s in stats.values()),
        "handshakes_per_node": max(s["handshakes"] for s in stats.values()),
        "cpu_s_per_node": round(sum(s["cpu_s"] for s in stats.values()) / len(stats), 3),
        "faults": fault,
        "load1": round(load1, 2),
    }
    detail = {
        "store_reads": sum(s["store_reads"] for s in stats.values()),
        "peer_failures": sum(s["peer_failures"] for s in stats.values()),
        "corrupt_refused": sum(s["corrupt_refused"] for s in stats.values()),
        "refused": sum(s["refused"] for s in stats.values()),
        "max_out": max(s["max_out"] for s in stats.values()),
        "max_in": max(s["max_in"] for s in stats.values()),
        # When each node held every piece (s after the go): the straggler tail's shape.
        "hold_s_min_median_p90_max": hold_quantiles(done, t0),
        # Each node's (the faulty ones named): whose subtrees finish last.
        "hold_s": {x: round(float(v.split()[1]) - t0, 2) for x, v in done.items()},
        "fault_nodes": dead or slow or corrupt,
        "handshakes_mean": round(sum(s["handshakes"] for s in stats.values()) / len(stats), 1),
        "busiest": busiest,
        "served_max": max(s["served_bytes"] for s in stats.values()),
        # The kernel's neighbour table (one for all namespaces): what this run added to
        # it (permanent entries are not counted against gc_thresh), whether it had to
        # force a garbage collection or overflowed meanwhile (anyone's: the counters are
        # the machine's), and the entries the nodes resolved themselves (no ARP: 0).
        "neigh": {
            "entries_before_after": [neigh0["entries"], neigh1["entries"]],
            "forced_gc_runs": neigh1["forced_gc_runs"] - neigh0["forced_gc_runs"],
            "table_fulls": neigh1["table_fulls"] - neigh0["table_fulls"],
            "permanent_per_node": min(s["neigh"]["permanent"] for s in stats.values()),
            "dynamic_max_per_node": max(s["neigh"]["dynamic"] for s in stats.values()),
            "dynamic_total": sum(s["neigh"]["dynamic"] for s in stats.values()),
        },
        # libtorrent: connections peers opened to it, nodes that added the web seed after
        # gaining nothing for the silence bound, nodes that had it from the start
        "incoming_max": max(s.get("incoming", 0) for s in stats.values()),
        # libtorrent: the most peer connections open at once on a node, both ways summed
        # (the record's max_open_connections is the larger way, as the tree's)
        "max_both": max(s.get("max_both", 0) for s in stats.values()),
        "fallbacks": sum(s.get("fallbacks", 0) for s in stats.values()),
        "webseeded": sum(bool(s.get("webseeded")) for s in stats.values()),
        "dropped_sample": next((s["dropped"] for s in stats.values() if s["dropped"]), {}),
        "log_sample": next((s["log"] for s in stats.values() if s["log"]), []),
    }
    # The bound, checked on every run (at 256 nodes this is the only place it can
    # be: the suite's smoke stops at 64): no node had more peer connections open at once,
    # either way, than the bound (the kernel's count, the listen backlog included).
    if record["max_open_connections"] > a.max_connections:
        most = record["max_open_connections"]
        a.failed.append(
            f"{n} nodes, {fault}: {most} peer connections open on one node, "
            f"above the bound {a.max_connections}"
        )
    log(f"run: {json.dumps(record)}")
    log(f"  detail: {json.dumps(detail)[:1500]}")
    a.details.append({**{k: record[k] for k in ("engine", "nodes", "faults")}, **detail})
    a.details[-1]["stats"] = (
        {x: {k: s.get(k) for k in ("held_ok", "handshakes", "incoming", "cpu_s", "served_bytes",
                                  "peer_bytes", "fallbacks", "webseeded")}
         for x, s in stats.items()}
        if engine == "libtorrent" else None
    )  # fmt: skip
    if any(s.get("trace") for s in stats.values()):  # SWARM_TRACE=1
        a.details[-1]["trace"] = {x: s["trace"] for x, s in stats.items()}
        a.details[-1]["rates"] = {x: s.get("rates") for x, s in stats.items()}
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="16,64,256")
    ap.add_argument("--shape", default="bench", choices=("bench", "10x", "smoke"))
    ap.add_argument("--faults", default="none")
    ap.add_argument(
        "--engine", default="tree",
        help="comma-separated: libtorrent (node_lt.py), any other the record's label for "
        "node.py's peer code; LABEL=DIR: the peer code of DIR (a checkout's lib/)",
    )  # fmt: skip
    ap.add_argument(
        "--lt-seed-upload", type=float, default=0.0,
        help="libtorrent: a web-seeded node's upload limit, in its share of the store's "
        "link (0: none)",
    )  # fmt: skip
    ap.add_argument(
        "--lt-slots", type=int, default=int(os.environ.get("SWARM_LT_SLOTS", 4)),
        help="libtorrent: peers any node unchokes at once (0: the connection bound, all)",
    )  # fmt: skip
    ap.add_argument(
        "--lt-seed-slots", type=int, default=int(os.environ.get("SWARM_LT_SEED_SLOTS", 2)),
        help="libtorrent: peers a web-seeded node unchokes at once (the others get its "
        "pieces by relays; 0: as every node, all)",
    )  # fmt: skip
    ap.add_argument(
        "--lt-webseeds", type=int, default=1,
        help="libtorrent: how many nodes get the store as web seed from the start (0: every "
        "node; 2 took 1.7x the piece bytes from the store at 64 nodes)",
    )  # fmt: skip
    ap.add_argument("--scale", type=int, default=64, help="piece bytes divided by this")
    ap.add_argument(
        "--run-blocks", default="0",
        help="image blocks a node asks of one peer in one request, as the agent's prefetch "
        "(prefetch_run_kib / block size: 32); 0: block by block. One value, or one per "
        "engine (comma-separated, in --engine's order)",
    )  # fmt: skip
    ap.add_argument("--store-mbit", type=float, default=0.4)
    ap.add_argument("--node-mbit", type=float, default=0.0, help="default: 10x the store's")
    ap.add_argument("--max-connections", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=300.0, help="for the nodes to start, stop")
    ap.add_argument(
        "--run-timeout", type=float, default=1800.0,
        help="a run not done by then is recorded unfinished (all_hold_s null)",
    )  # fmt: skip
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--port-base", type=int, default=int(os.environ.get("SWARM_PORT_BASE", 21750)))
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true", help="16 and 64 nodes, small and fast")
    ap.add_argument("--json", type=Path, required=True)
    a = ap.parse_args()
    if a.smoke:  # the suite's: a quarter of the pieces, a 256th of the bytes, 2 Mbit/s
        a.nodes, a.faults, a.shape, a.scale, a.store_mbit = "16,64", "none", "smoke", 256, 2.0
    a.node_mbit = a.node_mbit or 10 * a.store_mbit
    # The emulator's time against slurm-dev's (store 100 Mbit/s, the bytes unscaled): a
    # transfer takes `stretch` times longer here, and so may the peers' waits.
    a.stretch = max(1.0, 100.0 / a.store_mbit / a.scale)
    a.work = a.work or Path(f"/var/tmp/bootseer-swarm-{a.port_base}")
    if os.geteuid() != 0:
        raise SystemExit("bench.py: needs root (network namespaces, tc)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up on kill, too
    sizes = [int(x) for x in a.nodes.split(",")]
    faults = a.faults.split(",")
    if bad := [f for f in faults if f not in FAULTS]:
        raise SystemExit(f"bench.py: unknown faults {bad}: one of {FAULTS}")
    net = SwarmNetwork(
        a.port_base,
        tuple(f"n{i}" for i in range(1, max(sizes) + 1)),
        node_mbit=a.node_mbit,  # type: ignore[arg-type]
        store_mbit=a.store_mbit,  # type: ignore[arg-type]
    )
    records: list[dict[str, Any]] = []
    a.details = []
    a.failed = []
    detail_path = a.json.with_name(a.json.stem + ".detail.json")
    store: subprocess.Popen[str] | None = None
    # The nodes run a copy of node.py and of the peer code taken now: a long run measures
    # one version whatever is edited meanwhile (SWARM_LIB: another checkout's lib/).
    code = a.work / "code"
    shutil.rmtree(code, ignore_errors=True)
    lib = Path(os.environ.get("SWARM_LIB") or HERE.parents[2] / "lib")
    shutil.copytree(lib / "bootseer", code / "lib" / "bootseer",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    shutil.copy2(HERE / "node.py", code / "node.py")
    shutil.copy2(HERE / "node_lt.py", code / "node_lt.py")
    a.code = code
    # LABEL=DIR: that engine runs the peer code of DIR (another checkout's lib/, copied
    # now as this one's is), so two versions alternate in one run on the same network.
    engines, a.libs = [], {}
    for spec in a.engine.split(","):
        label, _, other = spec.partition("=")
        engines.append(label)
        if other:
            a.libs[label] = code / "engines" / label / "lib"
            shutil.copytree(Path(other) / "bootseer", a.libs[label] / "bootseer",
                            ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    runs = [int(x) for x in a.run_blocks.split(",")]
    if len(runs) not in (1, len(engines)):
        raise SystemExit(f"bench.py: --run-blocks {a.run_blocks}: one value, or one per engine")
    a.run_blocks = dict(zip(engines, runs * len(engines) if len(runs) == 1 else runs, strict=True))
    a.torrent = None
    try:
        pieces = make_pieces(a.work / "store", shape(a.shape), a.scale)
        if "libtorrent" in engines:
            a.torrent = make_torrent(a.work, pieces)
        log(
            f"{len(pieces)} pieces, {sum(p['size'] for p in pieces) / MiB:.2f} MiB; store "
            f"{a.store_mbit:g} Mbit/s, nodes {a.node_mbit:g} Mbit/s; {len(net.nodes)} hosts"
        )
        t = time.monotonic()
        net.up()
        log(f"network up in {time.monotonic() - t:.1f}s")
        store = subprocess.Popen(
            [*net.enter_store(), sys.executable, str(HERE / "store.py"),
             "--file", str(a.work / "store" / "pieces"),
             "--layout", str(a.work / "store" / "layout.json"),
             "--bind", net.store_ip, "--port", str(STORE_PORT)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert store.stdout is not None
        if store.stdout.readline().strip() != "ready":
            raise SystemExit("bench.py: the store did not start")
        for _ in range(a.runs):
            for n in sizes:
                for fault in faults:
                    for engine in engines:
                        log(f"run: {engine}, {n} nodes, faults {fault}")
                        records.append(one_run(net, n, pieces, fault, a, sys.executable, engine))
                        a.json.write_text(json.dumps(records, indent=1) + "\n")
                        # What the record leaves out (store reads, drops, the finish times'
                        # spread: the scale model's straggler term), beside it.
                        detail_path.write_text(json.dumps(a.details, indent=1) + "\n")
    finally:
        if store is not None:
            stop(store)
        net.down()
        shutil.rmtree(a.work, ignore_errors=True)
    a.json.write_text(json.dumps(records, indent=1) + "\n")
    for r in records:
        print(json.dumps(r))
    if a.failed:
        raise SystemExit("bench.py: checks failed: " + "; ".join(a.failed))


if __name__ == "__main__":
    main()
