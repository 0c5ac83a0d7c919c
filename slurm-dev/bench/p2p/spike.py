#!/usr/bin/env python3
"""Two spikes of peer-to-peer among a job's nodes (issue 10, item 2), and the baseline.

On slurm-dev's network (``slurm-dev/network.py``: every node and the store a host in a
network namespace of its own on one bridge, each link tbf-capped), N nodes fetch a hot
set (default 64 MiB in 256 KiB pieces, sha256 per piece known in advance, as in an image
manifest) from a store host that serves the pieces over HTTP:

- ``baseline``: every node fetches every piece from the store itself;
- ``direct``: rendezvous-hashed owners fetch from the store and serve their peers over TCP;
- ``libtorrent``: the same owners hand their pieces to libtorrent (``add_piece``), the
  others download them over BitTorrent (v2, SHA-256), explicit peers only.

Per run: store egress (bytes the store sent on its capped link), time until every node
holds the whole set, CPU-seconds of the node processes per GiB delivered to the nodes,
the load average, and the machine's CPU used by everything else during the run.

    spike.py --engine direct --nodes 8 --json out.json
    spike.py --engine all --runs 3 --json results.json   # alternating, medians printed

Needs root (network namespaces) and, for libtorrent, ``pip install libtorrent==2.1.1``
in the interpreter that runs it. Everything it starts is stopped by pid, and the network
removed, also on failure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # slurm-dev/
sys.path.insert(0, str(HERE.parent))  # slurm-dev/bench/

from measure import proc_cpu  # noqa: E402
from network import Network  # noqa: E402

WORK = Path(os.environ.get("BOOTSEER_BENCH_DIR", "/var/tmp/bootseer-p2p-spike"))
STORE_PORT = 8080
PEER_PORT = 6881
ENGINES = ("baseline", "direct", "libtorrent", "libtorrent-tls")


def make_hot_set(size: int, piece: int) -> tuple[Path, list[str]]:
    path = WORK / "store" / "hotset"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.stat().st_size != size:
        with open(path, "wb") as f:
            f.write(os.urandom(size))
    data = path.read_bytes()
    return path, [hashlib.sha256(data[o : o + piece]).hexdigest() for o in range(0, size, piece)]


def make_certs(nodes: tuple[str, ...]) -> Path:
    """libtorrent-tls: a job CA and one certificate per node signed by it (P-256), and the
    DH parameters libtorrent wants. A node certificate's name must be ``*`` or the
    torrent's name: libtorrent checks it (any other name fails the TLS handshake)."""
    d = WORK / "tls"
    d.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl("req", "-x509", *ec, "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.pem", "-days", "2",
            "-subj", "/CN=bootseer job 1234")  # fmt: skip
    for n in nodes:
        openssl("req", *ec, "-keyout", f"{d}/{n}.key", "-out", f"{d}/{n}.csr", "-subj", "/CN=*")
        openssl("x509", "-req", "-in", f"{d}/{n}.csr", "-CA", f"{d}/ca.pem", "-CAkey",
                f"{d}/ca.key", "-CAcreateserial", "-out", f"{d}/{n}.pem", "-days", "2")  # fmt: skip
    if not (d / "dh.pem").exists():
        openssl("dhparam", "-dsaparam", "-out", f"{d}/dh.pem", "2048")
    return d


def make_torrent(hotset: Path, piece: int, root_cert: str | None = None) -> Path:
    """A v2-only (SHA-256 merkle) torrent: what image registration would store beside the
    manifest. Its piece hashes are merkle roots over 16 KiB leaves, not sha256(piece).
    With ``root_cert`` (PEM), an SSL torrent: only peers with a certificate signed by it."""
    import libtorrent as lt

    out = WORK / "store" / f"hotset-{piece}{'-tls' if root_cert else ''}.torrent"
    ct = lt.create_torrent(lt.list_files(str(hotset)), piece, lt.create_torrent.v2_only)
    ct.set_priv(True)
    if root_cert:
        ct.set_root_cert(root_cert)
    lt.set_piece_hashes(ct, str(hotset.parent))
    out.write_bytes(lt.bencode(ct.generate()))
    return out


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot."""
    vals = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    total = sum(vals[:8])
    idle = vals[3] + vals[4]
    tck = os.sysconf("SC_CLK_TCK")
    return (total - idle) / tck, total / tck


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Lines:
    """Every line a child prints, in one queue, tagged with the child's name."""

    def __init__(self) -> None:
        self.q: queue.Queue[tuple[str, str]] = queue.Queue()

    def follow(self, name: str, proc: subprocess.Popen[str]) -> None:
        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self.q.put((name, line.rstrip("\n")))
            self.q.put((name, "<eof>"))

        threading.Thread(target=pump, daemon=True).start()

    def expect(self, names: set[str], word: str, timeout: float) -> dict[str, tuple[float, str]]:
        """Wait for ``word ...`` from every one of ``names``: {name: (when, rest)}."""
        got: dict[str, tuple[float, str]] = {}
        deadline = time.monotonic() + timeout
        while set(got) != names:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SystemExit(f"spike: no '{word}' from {sorted(names - set(got))}")
            try:
                name, line = self.q.get(timeout=left)
            except queue.Empty:
                continue
            if line == "<eof>" and name not in got:
                raise SystemExit(f"spike: {name} exited before '{word}'")
            if line == "<eof>":
                continue
            if line.split(" ", 1)[0] == word:
                got[name] = (time.monotonic(), line[len(word) + 1 :])
            else:
                print(f"  [{name}] {line}", file=sys.stderr)
        return got


def one_run(
    net: Network, engine: str, cfg: dict[str, Any], store_pid: int, timeout: float
) -> dict[str, Any]:
    run_dir = WORK / "nodes"
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = {**cfg, "engine": engine, "workdir": str(run_dir)}
    cfg_path = WORK / "config.json"
    cfg_path.write_text(json.dumps(cfg))
    lines = Lines()
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        for n in net.nodes:
            cmd = [*net.enter(n), sys.executable, "-X", "faulthandler", str(HERE / "node.py")]
            cmd += ["--config", str(cfg_path), "--node", n]
            procs[n] = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            lines.follow(n, procs[n])
        names = set(net.nodes)
        lines.expect(names, "ready", 60)
        time.sleep(1.0)  # let the setup's CPU settle out of the load figures
        egress0 = net.store_egress_bytes()
        rx0 = sum(net.node_rx_bytes(n) for n in net.nodes)
        store_cpu0 = proc_cpu(store_pid)
        busy0, total0 = machine_busy()
        load0 = os.getloadavg()[0]
        t0 = time.monotonic()
        for p in procs.values():
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        done = lines.expect(names, "done", timeout)
        t_all = max(when for when, _ in done.values()) - t0
        busy1, total1 = machine_busy()
        load1 = os.getloadavg()[0]
        egress = net.store_egress_bytes() - egress0
        rx = sum(net.node_rx_bytes(n) for n in net.nodes) - rx0
        store_cpu = proc_cpu(store_pid) - store_cpu0
        for p in procs.values():
            assert p.stdin is not None
            p.stdin.write("stop\n")
            p.stdin.flush()
        cpus = lines.expect(names, "cpu", 120)
        for p in procs.values():
            p.wait(30)
    finally:
        for p in procs.values():
            stop(p)
        shutil.rmtree(run_dir, ignore_errors=True)
    node_stats = {n: json.loads(rest) for n, (_, rest) in done.items()}
    node_cpu = sum(json.loads(rest)["cpu_s"] for _, rest in cpus.values())
    size = cfg["size"]
    delivered = size * len(net.nodes)  # bytes the nodes end up holding, all together
    ncpu = os.cpu_count() or 1
    ours = node_cpu + store_cpu
    machine = busy1 - busy0
    return {
        "engine": engine,
        "nodes": len(net.nodes),
        "hot_set_bytes": size,
        "piece_bytes": cfg["piece_bytes"],
        "all_hold_s": round(t_all, 3),
        "node_elapsed_s": {n: round(s["elapsed_s"], 3) for n, s in node_stats.items()},
        "store_egress_bytes": egress,
        "store_egress_ratio": round(egress / size, 3),
        "node_rx_bytes": rx,
        "node_cpu_s": round(node_cpu, 3),
        "store_cpu_s": round(store_cpu, 3),
        "node_cpu_s_per_gib": round(node_cpu / (delivered / 2**30), 3),
        "store_pieces": sum(s["store_pieces"] for s in node_stats.values()),
        "peer_pieces": sum(s["peer_pieces"] for s in node_stats.values()),
        "fallbacks": sum(s.get("fallbacks", 0) for s in node_stats.values()),
        "bad_digest": sum(s.get("bad_digest", 0) for s in node_stats.values()),
        "loadavg_1m_start": round(load0, 2),
        "loadavg_1m_end": round(load1, 2),
        "machine_cpu_busy_frac": round(machine / ((total1 - total0) or 1), 3),
        "others_cpu_s": round(max(machine - ours, 0.0), 2),
        "cpus": ncpu,
    }


def summary(records: list[dict[str, Any]]) -> str:
    rows = [
        "| engine | runs | all hold (s) | store egress / hot set | node CPU-s per GiB | "
        "store CPU-s | load 1m (end) | others' CPU-s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in ENGINES:
        rs = [r for r in records if r["engine"] == e]
        if not rs:
            continue

        def med(k: str, rs: list[dict[str, Any]] = rs) -> float:
            return float(statistics.median(r[k] for r in rs))

        rows.append(
            f"| {e} | {len(rs)} | {med('all_hold_s'):.2f} | {med('store_egress_ratio'):.3f} | "
            f"{med('node_cpu_s_per_gib'):.2f} | {med('store_cpu_s'):.2f} | "
            f"{med('loadavg_1m_end'):.2f} | {med('others_cpu_s'):.1f} |"
        )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--engine",
        default="all",
        help=f"one of {', '.join(ENGINES)}, several joined by commas (alternating), or "
        "all (the first three)",
    )
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--runs", type=int, default=1, help="rounds (engines alternate within one)")
    ap.add_argument("--size-mib", type=int, default=64)
    ap.add_argument("--piece-kib", type=int, default=256)
    ap.add_argument("--store-mbit", type=int, default=100)
    ap.add_argument("--node-mbit", type=int, default=1000)
    ap.add_argument("--port-base", type=int, default=18900)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument(
        "--lt-connect",
        choices=["one", "both"],
        default="one",
        help="libtorrent: each pair connects once (one) or both ways (both)",
    )
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    engines = list(ENGINES[:3]) if a.engine == "all" else a.engine.split(",")
    if not set(engines) <= set(ENGINES):
        ap.error(f"--engine: one of {', '.join(ENGINES)} or all")
    size, piece = a.size_mib * 2**20, a.piece_kib * 1024

    WORK.mkdir(parents=True, exist_ok=True)
    hotset, digests = make_hot_set(size, piece)
    nodes = tuple(f"n{i}" for i in range(1, a.nodes + 1))
    torrent = make_torrent(hotset, piece) if "libtorrent" in engines else None
    tls_dir = make_certs(nodes) if "libtorrent-tls" in engines else None
    tls_torrent = None
    if tls_dir:
        tls_torrent = make_torrent(hotset, piece, (tls_dir / "ca.pem").read_text())
    net = Network(a.port_base, nodes, a.node_mbit, a.store_mbit)
    cfg = {
        "nodes": list(nodes),
        "ips": {n: net.node_ip(n) for n in nodes},
        "store_ip": net.store_ip,
        "store_port": STORE_PORT,
        "peer_port": PEER_PORT,
        "digests": digests,
        "piece_bytes": piece,
        "size": size,
        "torrent": str(torrent) if torrent else None,
        "tls_torrent": str(tls_torrent) if tls_torrent else None,
        "tls_dir": str(tls_dir) if tls_dir else None,
        "lt_connect": a.lt_connect,
        "job_token": hashlib.sha256(b"site-secret|job 1234").hexdigest(),
    }
    records: list[dict[str, Any]] = []
    store: subprocess.Popen[str] | None = None
    try:
        net.down()  # an earlier, interrupted run's
        net.store_up()
        for n in nodes:
            net.node_up(n)
        cmd = [*net.enter_store(), sys.executable, str(HERE / "store.py"), "--file", str(hotset)]
        cmd += ["--piece-bytes", str(piece), "--bind", net.store_ip, "--port", str(STORE_PORT)]
        store = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert store.stdout is not None
        if store.stdout.readline().strip() != "ready":
            raise SystemExit("spike: the store did not start")
        for rnd in range(a.runs):
            for e in engines:
                r = one_run(net, e, cfg, store.pid, a.timeout)
                r["round"] = rnd
                r["lt_connect"] = a.lt_connect
                records.append(r)
                print(
                    f"round {rnd} {e:10s} all hold {r['all_hold_s']:7.2f} s  "
                    f"egress {r['store_egress_ratio']:.3f}x  "
                    f"node CPU {r['node_cpu_s']:.1f} s ({r['node_cpu_s_per_gib']:.2f}/GiB)  "
                    f"load {r['loadavg_1m_end']:.2f}  others {r['others_cpu_s']:.1f} CPU-s",
                    flush=True,
                )
                if a.json:
                    a.json.write_text(json.dumps(records, indent=1) + "\n")
                time.sleep(2)  # queues drain, sockets close
    finally:
        if store is not None:
            stop(store)
        net.down()
    print(summary(records))


if __name__ == "__main__":
    main()
