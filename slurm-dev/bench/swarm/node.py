"""One emulated node: the agent's real peer code, without slurmd, FUSE or the agent.

Run by ``bench.py`` in the node's network namespace. It serves the job's pieces with a
real :class:`~bootseer.p2p.server.PeerServer` (per-job proof, the job's addresses only,
the job's pieces only, held pieces sent with sendfile) and gets every piece of the job
with the real :class:`~bootseer.p2p.swarm.Swarm` and
:class:`~bootseer.p2p.client.PeerClient` (who to ask, digest checked on receipt, a peer
that fails or lies dropped), from the store (HTTP, behind the store's slower link) when
the swarm says so. What the agent adds around them is emulated in a few lines: one fetch
per piece however many ask (the agent's fetcher and ``p2p.pieces``), the cache (a file
per piece under ``--dir``), the prolog's readers (a window of pieces in flight per kind,
in manifest order, as the image prefetch, the snapshot restore and the checkpoint mount
read).

Protocol on stdin/stdout (one line each): prints ``ready`` once it listens; ``go`` starts
the fetch; prints ``done <monotonic time>`` when it holds every piece; ``stop`` ends it,
after it prints one JSON line of its counts.

Faults: ``--corrupt`` serves a byte flipped in every piece it sends (it holds good ones).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import dataclasses
import hashlib
import http.client
import inspect
import json
import os
import resource
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

# SWARM_LIB: measure another version of the peer code (a checkout's lib/)
sys.path.insert(0, os.environ.get("SWARM_LIB") or str(Path(__file__).resolve().parents[3] / "lib"))

from bootseer.p2p.client import PeerClient
from bootseer.p2p.server import HeldPiece, PeerServer, ServedJob
from bootseer.p2p.swarm import Swarm
from bootseer.p2p.wire import PeerError, PieceRequest

try:  # pieces named as this lib names them: BLAKE3 since bootseer.digest
    from bootseer.digest import matches as digest_matches

    NAME = "digest"
except ImportError:  # SWARM_LIB: a lib from before, SHA-256 alone (bench.py gives both)
    NAME = "sha256"

    def digest_matches(data: bytes, d: str) -> bool:
        return hashlib.sha256(data).hexdigest() == d


try:
    from bootseer.p2p.wire import run_digest
except ImportError:  # peer code from before runs (SWARM_LIB): block by block
    run_digest = None  # type: ignore[assignment]

WINDOWS = {"block": 16, "frame": 4, "unit": 16}  # pieces in flight per kind, per node
PRIORITY = 0  # the fetcher's DEMAND
ANSWER_BY = 0.8  # a run is answered with what came by this part of the asker's bound
RUN_SPAN = 2  # a run's blocks lie within this many runs' worth of the readers' order


class Node:
    def __init__(self, a: argparse.Namespace) -> None:
        spec = json.loads(Path(a.spec).read_text())
        self.name: str = a.name
        self.job: int = spec["job"]
        self.nodes: list[str] = spec["nodes"]
        self.ips: dict[str, str] = spec["ips"]
        self.port: int = spec["port"]
        self.pieces: list[dict[str, Any]] = spec["pieces"]
        self.by_sha = {p[NAME]: p for p in self.pieces}
        self.store = (spec["store_ip"], spec["store_port"])
        # Long: a store asked again too soon sends the piece twice over its slow link, and
        # at 64 nodes that fed on itself (117 s: store egress 5.1x, no run finished).
        self.store_timeout = 900.0
        self.corrupt = a.corrupt
        self.dir = Path(a.dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.held: set[str] = set()
        # Each piece's file, made once: a Path built per request was the emulator's own
        # largest cost per piece served (pathlib's parsing), no part of the peer code.
        bad = ".bad" if self.corrupt else ""
        self.held_at = {
            p[NAME]: HeldPiece(self.dir / (p[NAME] + bad), p["size"]) for p in self.pieces
        }
        # When each piece came (s from the go) and whence: "store" or the node asked.
        self.got: dict[str, tuple[float, str]] = {}
        self.t0 = 0.0
        self.inflight: dict[str, cf.Future[bytes]] = {}
        self.lock = threading.Lock()
        self.local = threading.local()
        beat = {}  # the server's heartbeat, stretched as the bounds are, where it has one
        if "heartbeat" in inspect.signature(PeerServer).parameters:
            beat["heartbeat"] = spec["heartbeat"]
        key = bytes.fromhex(spec["site_key"])
        token = bytes.fromhex(spec["token"])  # the agent derives it: auth.job_token
        ip = self.ips[self.name]
        addresses = frozenset(self.ips[n] for n in self.nodes)
        self.served_job = ServedJob(addresses, self.provide, self.held_piece)
        self.server = PeerServer(
            (ip, self.port),
            key,
            lambda job: self.served_job if job == self.job else None,
            self.log,
            max_connections=spec["max_connections"],
            serve_timeout=spec["peer_timeout"],
            job_wait=spec["peer_timeout"] * 2 / 3,
            **beat,
        )
        bound = {}  # the client's own bound on open connections, where it has one
        if "max_open" in inspect.signature(PeerClient).parameters:
            bound["max_open"] = spec["max_connections"]
        self.client = PeerClient(
            timeout=spec["peer_timeout"], silence=spec["peer_silence"], **bound
        )
        self.swarm = Swarm(
            self.job,
            self.name,
            self.nodes,
            token,
            lambda n: (self.ips[n], self.port),
            self.client,
            self.log,
            dead_for=spec["dead_for"],
        )
        if "intake" in inspect.signature(ServedJob).parameters:
            # What this node's pieces come in at, told to its askers (as the agent does)
            self.served_job = dataclasses.replace(self.served_job, intake=self.swarm.rates.median)
        self.engine = spec["engine"]
        # Blocks a run asks of one peer at most (the agent's prefetch_run_kib over its
        # block size: 8 MiB / 256 KiB); 0 or 1: block by block, as before runs, or where
        # the peer code has none.
        self.run_size = spec.get("run_blocks", 0) if hasattr(self.swarm, "fetch_run") else 0
        # Threads getting a run's blocks for a child (the agent's fetcher pool).
        self.relays = cf.ThreadPoolExecutor(64, thread_name_prefix="relay")
        self.store_bytes = 0
        self.store_reads = 0
        self.connections = Connections(self.port)
        self.logs: list[str] = []

    def log(self, msg: str) -> None:
        with self.lock:
            if len(self.logs) < 50:
                self.logs.append(msg)

    # -- serving ------------------------------------------------------------------------

    def held_piece(self, req: PieceRequest) -> HeldPiece | list[HeldPiece] | None:
        if req.blocks:  # a run: sent from the files when every block is held
            shas = self.run_blocks(req)
            if shas is None or any(sha not in self.held for sha in shas):
                return None
            return [self.held_at[sha] for sha in shas]
        if req.piece not in self.held:
            return None
        return self.held_at.get(req.piece)

    def run_blocks(self, req: PieceRequest) -> list[str] | None:
        """The run's blocks (digests), if it names blocks of the job's image exactly
        (``imagesource.is_run``); None otherwise."""
        if any(i >= len(self.pieces) or self.pieces[i]["kind"] != "block" for i in req.blocks):
            return None
        shas = [self.pieces[i][NAME] for i in req.blocks]
        return shas if run_digest(shas) == req.piece else None

    def provide(self, req: PieceRequest, deadline: float) -> bytes | list[bytes | None]:
        if req.blocks:
            return self.provide_run(req, deadline)
        if req.piece not in self.by_sha:
            raise PeerError("missing", f"{req.piece[:12]} is no piece of job {self.job}")
        if req.cached_only and req.piece not in self.held:
            raise PeerError("missing", "not held here")
        data = self.get(req.piece).result(timeout=max(0.0, deadline - time.monotonic()))
        return flip(data) if self.corrupt else data

    def provide_run(self, req: PieceRequest, deadline: float) -> list[bytes | None]:
        """A run's blocks for a child, as ``imagesource.provide_run``: those held, and the
        others got for it (in runs of this node's own, from the node above it) by a
        little before the asker's bound; a block not got by then is not sent."""
        shas = self.run_blocks(req)
        if shas is None:
            raise PeerError("missing", "not a run of blocks of the job's image")
        futs = self.get_blocks(shas, self.relays)
        cf.wait(futs, timeout=max(0.0, deadline - time.monotonic()) * ANSWER_BY)
        out: list[bytes | None] = [
            f.result() if f.done() and f.exception() is None else None for f in futs
        ]
        if all(b is None for b in out):
            raise PeerError("failed", f"no block of the run of {len(out)} came in time")
        return [flip(b) if b is not None and self.corrupt else b for b in out]

    # -- getting ------------------------------------------------------------------------

    def get_blocks(self, shas: list[str], pool: cf.Executor) -> list[cf.Future[bytes]]:
        """The blocks, each fetched once however many ask: those no one is getting yet
        asked in runs of this node's parents (``prefetch.request_blocks``: consecutive
        among a parent's, up to ``run_blocks``), the rest alone, each unit on ``pool``."""
        futs: list[cf.Future[bytes]] = []
        mine: list[str] = []
        with self.lock:
            for sha in shas:
                fut = self.inflight.get(sha)
                if fut is None:
                    fut = self.inflight[sha] = cf.Future()
                    mine.append(sha)
                futs.append(fut)
        units: list[tuple[str | None, list[str]]] = []
        filling: dict[str, tuple[int, list[str]]] = {}  # peer -> (its run's start, run)
        span = RUN_SPAN * self.run_size  # prefetch.RUN_SPAN: within 2 runs' worth of blocks
        for k, sha in enumerate(mine):
            peer = self.swarm.run_source(sha) if sha not in self.held else None
            if peer is None:
                units.append((None, [sha]))
                continue
            open_run = filling.get(peer)
            if open_run is None or len(open_run[1]) >= self.run_size or k - open_run[0] >= span:
                open_run = filling[peer] = (k, [])
                units.append((peer, open_run[1]))
            open_run[1].append(sha)
        # In the readers' order (the agent's prefetch: its trace's). Its own blocks first
        # (as the agent's fill orders them) read every block from the store in the first
        # 50 s while the peers' runs waited, past the asker's bound: 225 store reads
        # more, 120 s against 102 s (16 nodes, 10x set, runs not yet within RUN_SPAN).
        for peer, run in units:
            pool.submit(self.fetch_unit, peer, run)
        return futs

    def fetch_unit(self, peer: str | None, shas: list[str]) -> None:
        """Claimed blocks (their futures are this call's to settle): a run of ``peer``'s
        in one request, each block checked by its digest (``Swarm.fetch_run``); what it
        did not bring, and a unit with no peer, alone."""
        alone = shas
        if peer is not None:
            blocks = [(self.by_sha[sha]["index"], sha, self.by_sha[sha]["size"]) for sha in shas]
            try:
                got = self.swarm.fetch_run(peer, blocks, PRIORITY)
            except Exception as exc:  # (it never raises; were it to, no reader may hang)
                self.log(f"run from {peer}: {type(exc).__name__}: {exc}")
                got = [None] * len(shas)
            alone = []
            for sha, block in zip(shas, got, strict=True):
                if block is None:
                    alone.append(sha)
                    continue
                data = bytes(block[0])
                self.keep(sha, data, peer)
                self.inflight[sha].set_result(data)
            del got
        for sha in alone:
            fut = self.inflight[sha]
            try:
                fut.set_result(self.fetch(sha))
            except BaseException as exc:
                fut.set_exception(exc)

    def get(self, sha: str) -> cf.Future[bytes]:
        """The piece, fetched once however many ask (the node's own readers, its peers)."""
        with self.lock:
            fut = self.inflight.get(sha)
            if fut is not None:
                return fut
            fut = self.inflight[sha] = cf.Future()
        if sha in self.held:
            fut.set_result((self.dir / sha).read_bytes())
            return fut
        try:
            fut.set_result(self.fetch(sha))
        except BaseException as exc:
            fut.set_exception(exc)
        return fut

    def fetch(self, sha: str) -> bytes:
        p = self.by_sha[sha]
        data = self.swarm.fetch(sha, PRIORITY)
        whence = self.swarm.source(sha) or "store"
        if data is None:
            whence = "store"
            data = self.from_store(p)
            if not digest_matches(data, sha):
                raise RuntimeError(f"piece {p['index']}: digest mismatch in the store")
        self.keep(sha, data, whence)
        return data

    def keep(self, sha: str, data: bytes, whence: str) -> None:
        """A verified piece into this node's files (the agent's cache), held from now."""
        path = self.dir / sha
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.rename(path)
        if self.corrupt:
            (self.dir / (sha + ".bad")).write_bytes(flip(data))
        with self.lock:
            self.held.add(sha)
            self.got[sha] = (round(time.monotonic() - self.t0, 2), whence)

    def from_store(self, p: dict[str, Any]) -> bytes:
        conn = getattr(self.local, "store", None)
        tries = 30  # the store is the source of truth: an agent retries it, so does this
        for attempt in range(tries):
            try:
                if conn is None:
                    # A store request unanswered this long is asked again on a new
                    # connection.
                    conn = http.client.HTTPConnection(*self.store, timeout=self.store_timeout)
                    self.local.store = conn
                    conn.connect()
                    keepalive(conn.sock)
                conn.request("GET", f"/p/{p['index']}")
                resp = conn.getresponse()
                data = resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"store: {resp.status} for piece {p['index']}")
                with self.lock:
                    self.store_bytes += len(data)
                    self.store_reads += 1
                return data
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                conn = self.local.store = None
                self.log(f"store: piece {p['index']}: {type(exc).__name__}: {exc}")
                if attempt == tries - 1:
                    raise
                # A reset connection (before the emulator's neighbours were permanent,
                # also ARP unanswered behind a full store link): back off, up to 5 s.
                time.sleep(min(5.0, 0.1 * 2**attempt))
        raise AssertionError("unreachable")

    def run(self) -> float:
        """Every piece of the job, each kind read in order with its window; when done."""
        kinds: dict[str, list[str]] = {}
        for p in self.pieces:
            kinds.setdefault(p["kind"], []).append(p[NAME])
        pools = []
        futs = []
        for kind, shas in kinds.items():
            pool = cf.ThreadPoolExecutor(WINDOWS.get(kind, 8), thread_name_prefix=kind)
            pools.append(pool)
            if kind == "block" and self.run_size > 1:
                # As the agent's prefetch: a window of runs, each a request to one peer.
                futs += self.get_blocks(shas, pool)
                continue
            futs += [pool.submit(lambda s=s: self.get(s).result()) for s in shas]
        for f in futs:
            f.result()
        done = time.monotonic()
        for pool in pools:
            pool.shutdown()
        return done

    def verify_all(self) -> int:
        """How many pieces this node holds with the right digest (read back from its files)."""
        ok = 0
        for p in self.pieces:
            path = self.dir / p[NAME]
            if path.exists() and digest_matches(path.read_bytes(), p[NAME]):
                ok += 1
        return ok


NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
TCP_ESTABLISHED = 1


class Connections:
    """The most peer connections open at once on a node: ones it opened to peers' port
    (``max_out``), ones peers opened to its port (``max_in``, those still in the listen
    backlog included), both together (``max_both``). The kernel's count (TCP established
    in the node's namespace), asked by sock_diag (:func:`established`) twice a second:
    reading /proc/net/tcp walks the machine's whole TCP hash table, 3.7 ms a read here,
    and at 5 reads a second that was half a node's CPU."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.max_out = self.max_in = self.max_both = 0

    def sample(self, stop: threading.Event) -> None:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
            while not stop.wait(0.5):
                out = inn = 0
                for sport, dport in established(nl):
                    inn += sport == self.port
                    out += dport == self.port
                self.max_out = max(self.max_out, out)
                self.max_in = max(self.max_in, inn)
                self.max_both = max(self.max_both, out + inn)


def established(nl: socket.socket) -> list[tuple[int, int]]:
    """(local port, remote port) of every established IPv4 TCP connection in this
    network namespace: an inet_diag dump (what ``ss`` asks), filtered by state in the
    kernel."""
    # nlmsghdr (len, type, flags REQUEST|DUMP, seq, pid) + inet_diag_req_v2 (family,
    # protocol, ext, pad, states) + an empty inet_diag_sockid (48 bytes)
    req = struct.pack("=BBBxI48x", socket.AF_INET, socket.IPPROTO_TCP, 0, 1 << TCP_ESTABLISHED)
    nl.send(struct.pack("=IHHII", 16 + len(req), SOCK_DIAG_BY_FAMILY, 0x301, 1, 0) + req)
    ports = []
    while True:
        buf = nl.recv(1 << 16)
        at = 0
        while at + 16 <= len(buf):
            length, kind = struct.unpack_from("=IH", buf, at)
            if kind == 3:  # NLMSG_DONE
                return ports
            if kind == 2:  # NLMSG_ERROR
                raise OSError(f"sock_diag: error {struct.unpack_from('=i', buf, at + 16)[0]}")
            # inet_diag_msg: family, state, timer, retrans, then the sockid's ports (BE)
            ports.append(struct.unpack_from("!HH", buf, at + 16 + 4))
            at += (length + 3) & ~3
        if not buf:
            return ports


def keepalive(sock: socket.socket) -> None:
    """Probe a store connection that has been silent for 20 s, six times 5 s apart: the
    store's kernel answers for a live connection however slow its link, and with a reset
    for one the store has dropped. Now and then the store resets a connection and the
    reset is lost in its link's full queue (tbf drops 10-20% of its packets here): the
    node then waited the whole store timeout (900 s) for a reply that never came, one
    16-node run in five stalled so with every other node done."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 20)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 6)


def neighbours() -> dict[str, int]:
    """This namespace's IPv4 neighbour table (/proc/self/net/arp): the permanent entries
    ``swarmnet`` installed, and any the node had to resolve (ATF_PERM is flag 0x4)."""
    perm = dynamic = 0
    with open("/proc/self/net/arp") as f:
        next(f)
        for line in f:
            if int(line.split()[2], 16) & 0x4:
                perm += 1
            else:
                dynamic += 1
    return {"permanent": perm, "dynamic": dynamic}


def count_handshakes(port: int) -> list[int]:
    """Count the peer connections this process sets up (each one authenticated by the
    server's hello), whatever version of the client makes them: [count]."""
    count = [0]
    connect = socket.create_connection

    def counted(address: Any, *args: Any, **kw: Any) -> socket.socket:
        if address[1] == port:
            count[0] += 1
        return connect(address, *args, **kw)

    socket.create_connection = counted  # type: ignore[assignment]
    return count


def flip(data: bytes) -> bytes:
    return bytes([data[0] ^ 0xFF]) + data[1:]


def profile_threads(path: str) -> Any:
    """Profile every thread of this process (SWARM_PROFILE=DIR: where the CPU goes);
    returns a function that writes the merged stats to DIR/<node>.pstats. Each thread is
    timed by its own CPU time (``time.thread_time``), not the wall clock: on a loaded
    machine the wall clock charges a function for every wait for a core or the GIL, and
    the profile showed lock waits and descheduling, not work."""
    import cProfile
    import pstats

    profiles: list[cProfile.Profile] = []
    run = threading.Thread.run

    def profiled(self: threading.Thread) -> None:
        prof = cProfile.Profile(time.thread_time)
        profiles.append(prof)
        prof.enable()
        try:
            run(self)
        finally:
            prof.disable()

    threading.Thread.run = profiled  # type: ignore[method-assign]
    main_prof = cProfile.Profile(time.thread_time)
    profiles.append(main_prof)
    main_prof.enable()

    def dump(name: str) -> None:
        for prof in profiles:
            prof.disable()
        stats = pstats.Stats(profiles[0])
        for prof in profiles[1:]:
            with contextlib.suppress(TypeError):  # a thread that never ran
                stats.add(prof)
        Path(path).mkdir(parents=True, exist_ok=True)
        stats.dump_stats(str(Path(path) / f"{name}.pstats"))

    return dump


def main() -> None:
    dump = profile_threads(os.environ["SWARM_PROFILE"]) if os.environ.get("SWARM_PROFILE") else None
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--corrupt", action="store_true")
    a = ap.parse_args()
    # ~90 threads a node, 256 nodes: 512 KiB stacks, not 8 MiB, on a machine shared with others
    threading.stack_size(512 << 10)
    node = Node(a)
    handshakes = count_handshakes(node.port)
    node.server.start()
    stop = threading.Event()
    threading.Thread(target=node.connections.sample, args=(stop,), daemon=True).start()
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    t0 = node.t0 = time.monotonic()
    try:
        done = node.run()
        print(f"done {done}", flush=True)
    except Exception as exc:
        print(f"failed {type(exc).__name__}: {exc}", flush=True)
    sys.stdin.readline()  # stop
    stop.set()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    if dump is not None:  # before the counts: bench.py stops the node once it has them
        dump(node.name)
    st = node.swarm.stats
    print(
        json.dumps(
            {
                "node": node.name,
                "held_ok": node.verify_all(),
                "store_bytes": node.store_bytes,
                "store_reads": node.store_reads,
                "peer_bytes": st.peer_bytes,
                "peer_failures": st.peer_failures,
                "corrupt_refused": st.corrupt,
                "served_bytes": node.server.served_bytes,
                "served_pieces": node.server.served_pieces,
                "refused": node.server.refused,
                "handshakes": handshakes[0],
                "max_out": node.connections.max_out,
                "max_in": node.connections.max_in,
                "max_both": node.connections.max_both,
                "cpu_s": ru.ru_utime + ru.ru_stime,
                "neigh": neighbours(),
                "started": t0,
                "dropped": dict(list(st.dropped.items())[:5]),
                # the peers' rates this node measured (bytes/s), where the peer code does
                "rates": {p: round(r) for p, r in node.swarm.rates.known().items()}
                if hasattr(node.swarm, "rates")
                else None,
                "log": node.logs[:10],
                # SWARM_TRACE=1: each piece's arrival (s from the go) and source, in
                # manifest order (where a run loses its time: bench.py's detail)
                "trace": [node.got.get(p[NAME]) for p in node.pieces]
                if os.environ.get("SWARM_TRACE")
                else None,
            }
        ),
        flush=True,
    )
    node.server.close()
    os._exit(0)


if __name__ == "__main__":
    main()
