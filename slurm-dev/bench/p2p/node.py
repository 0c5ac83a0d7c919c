"""One node of the p2p spike: fetches the whole hot set with one engine, in its own netns.

Talks to ``spike.py`` over stdin/stdout: prints ``ready`` once it listens, starts on a
``go`` line, prints ``done {json}`` once it holds every piece (verified), keeps serving its
peers until a ``stop`` line, then prints ``cpu {json}`` (its CPU since ``go``, all threads)
and exits.

Engines:

- ``baseline``: every piece from the store, 16 at a time.
- ``direct``: each piece has one owner, the node with the highest sha256(node + digest)
  (rendezvous hashing over the job's node list). The owner fetches the piece from the
  store (once: concurrent wants share one fetch) and serves it on its TCP port; the other
  nodes ask the owner (which fetches on demand if it does not hold the piece yet), check
  the sha256 and fall back to the store on a bad digest, an error or a timeout. Peer
  connections are authenticated per job: the server sends a nonce, the client answers
  HMAC-SHA256(job token, nonce), as a token derived from a root-only site secret would.
- ``libtorrent``: one session per node, a v2 (SHA-256 merkle) torrent of the hot set, no
  tracker/DHT/LSD/UPnP/NAT-PMP/uTP, explicit peers (``connect_peer``). Each piece's owner
  (the same rendezvous hash) fetches it from the store over HTTP and hands it to
  libtorrent with ``add_piece``; every other node downloads it over BitTorrent.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import hmac
import http.client
import json
import os
import resource
import socket
import socketserver
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

PARALLEL = 16  # fetches in flight per node (every engine)
STORE_SLOTS = 8  # a direct owner's store fetches at once (its own wants and its peers')
PEER_TIMEOUT = 10.0  # seconds a direct peer may stall before the store is asked instead
# libtorrent's defaults are made for the Internet: with them, 6 of 44 runs stalled for 60 s
# (a group of nodes lost its connections to the rest and waited min_reconnect_time, or
# waited out request_timeout for a block). On a cluster's fabric: retry at once. With
# these, 0 of 10 runs stalled. SPIKE_LT_SETTINGS='{...}' overrides (e.g. the defaults:
# '{"min_reconnect_time": 60, "request_timeout": 60, "piece_timeout": 20,
#   "close_redundant_connections": true}').
LT_TUNING = {
    "close_redundant_connections": False,
    "min_reconnect_time": 1,
    "request_timeout": 5,
    "piece_timeout": 5,
}


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def owner_of(nodes: list[str], digest: str) -> str:
    """Rendezvous hashing: the node with the highest sha256(node + digest) owns the piece."""
    return max(nodes, key=lambda n: hashlib.sha256(f"{n}{digest}".encode()).digest())


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if not k:
            raise ConnectionError("peer closed")
        got += k
    return bytes(buf)


class Node:
    def __init__(self, cfg: dict[str, Any], name: str) -> None:
        self.cfg = cfg
        self.name = name
        self.nodes: list[str] = cfg["nodes"]
        self.digests: list[str] = cfg["digests"]
        self.piece_bytes: int = cfg["piece_bytes"]
        self.size: int = cfg["size"]
        self.index = {bytes.fromhex(d): i for i, d in enumerate(self.digests)}
        self.owner = [owner_of(self.nodes, d) for d in self.digests]
        self.dir = Path(cfg["workdir"]) / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.local = threading.local()
        self.stats = {"store_pieces": 0, "peer_pieces": 0, "fallbacks": 0, "bad_digest": 0}
        self.stats_lock = threading.Lock()

    def count(self, key: str, n: int = 1) -> None:
        with self.stats_lock:
            self.stats[key] += n

    def piece_len(self, i: int) -> int:
        return min(self.piece_bytes, self.size - i * self.piece_bytes)

    def store_get(self, i: int) -> bytes:
        """One piece from the store over a keep-alive connection of this thread's."""
        for attempt in range(3):
            conn = getattr(self.local, "store", None)
            if conn is None:
                conn = http.client.HTTPConnection(self.cfg["store_ip"], self.cfg["store_port"], 60)
                self.local.store = conn
            try:
                conn.request("GET", f"/p/{i}")
                r = conn.getresponse()
                data = r.read()
                if r.status != 200:
                    raise OSError(f"store answered {r.status}")
                if hashlib.sha256(data).hexdigest() != self.digests[i]:
                    raise OSError(f"store piece {i}: bad digest")
                self.count("store_pieces")
                return data
            except (OSError, http.client.HTTPException) as e:
                print(f"{self.name} store piece {i}: {e!r}", file=sys.stderr, flush=True)
                conn.close()
                self.local.store = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    # -- the engines -------------------------------------------------------------------

    def setup(self) -> None:
        """Listen / start the session (before ``go``: an agent is up before the job)."""

    def run(self) -> None:
        raise NotImplementedError


class Baseline(Node):
    def setup(self) -> None:
        self.fd = os.open(self.dir / "hotset", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.ftruncate(self.fd, self.size)

    def run(self) -> None:
        def one(i: int) -> None:
            os.pwrite(self.fd, self.store_get(i), i * self.piece_bytes)

        with cf.ThreadPoolExecutor(PARALLEL) as pool:
            list(pool.map(one, range(len(self.digests))))


class Direct(Node):
    def setup(self) -> None:
        self.fd = os.open(self.dir / "hotset", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.ftruncate(self.fd, self.size)
        self.have = [False] * len(self.digests)
        self.inflight: dict[int, cf.Future[None]] = {}
        self.lock = threading.Lock()
        self.store_slots = threading.Semaphore(STORE_SLOTS)
        self.token = bytes.fromhex(self.cfg["job_token"])
        node = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                sock: socket.socket = self.request
                sock.settimeout(30)
                nonce = os.urandom(16)
                sock.sendall(nonce)
                mac = recv_exact(sock, 32)
                want = hmac.new(node.token, nonce, hashlib.sha256).digest()
                if not hmac.compare_digest(mac, want):
                    return  # not of this job: closed without a word
                while True:
                    try:
                        digest = recv_exact(sock, 32)
                    except (ConnectionError, TimeoutError):
                        return
                    i = node.index.get(digest)
                    data = b""
                    if i is not None and (node.have[i] or node.owner[i] == node.name):
                        try:
                            node.ensure(i)  # on demand: the owner fetches it now
                            data = os.pread(node.fd, node.piece_len(i), i * node.piece_bytes)
                        except OSError:
                            data = b""
                    sock.sendall(struct.pack("!BI", 0 if data else 1, len(data)) + data)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = 128

        self.server = Server((self.cfg["ips"][self.name], self.cfg["peer_port"]), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def ensure(self, i: int) -> None:
        """Hold piece ``i`` (from the store); concurrent callers share one fetch."""
        if self.have[i]:
            return
        with self.lock:
            fut = self.inflight.get(i)
            mine = fut is None
            if fut is None:
                fut = self.inflight[i] = cf.Future()
        if mine:
            try:
                with self.store_slots:
                    data = self.store_get(i)
                os.pwrite(self.fd, data, i * self.piece_bytes)
                self.have[i] = True
                fut.set_result(None)
            except BaseException as e:
                fut.set_exception(e)
                with self.lock:
                    del self.inflight[i]
                raise
        fut.result()

    def peer_conn(self, peer: str) -> socket.socket:
        conns: dict[str, socket.socket] = self.local.__dict__.setdefault("peers", {})
        sock = conns.get(peer)
        if sock is None:
            sock = socket.create_connection(
                (self.cfg["ips"][peer], self.cfg["peer_port"]), timeout=PEER_TIMEOUT
            )
            nonce = recv_exact(sock, 16)
            sock.sendall(hmac.new(self.token, nonce, hashlib.sha256).digest())
            conns[peer] = sock
        return sock

    def peer_get(self, i: int) -> bytes | None:
        peer = self.owner[i]
        try:
            sock = self.peer_conn(peer)
            sock.sendall(bytes.fromhex(self.digests[i]))
            status, n = struct.unpack("!BI", recv_exact(sock, 5))
            data = recv_exact(sock, n)
        except OSError:
            conn = self.local.__dict__.get("peers", {}).pop(peer, None)
            if conn is not None:
                conn.close()
            return None
        if status != 0:
            return None
        if hashlib.sha256(data).hexdigest() != self.digests[i]:
            self.count("bad_digest")
            return None
        self.count("peer_pieces")
        return data

    def one(self, i: int) -> None:
        if self.owner[i] == self.name:
            self.ensure(i)
            return
        data = self.peer_get(i)
        if data is None:
            self.count("fallbacks")
            self.ensure(i)
            return
        os.pwrite(self.fd, data, i * self.piece_bytes)
        self.have[i] = True

    def run(self) -> None:
        with cf.ThreadPoolExecutor(PARALLEL) as pool:
            list(pool.map(self.one, range(len(self.digests))))


class Torrent(Node):
    def setup(self) -> None:
        import libtorrent as lt

        self.lt = lt
        ip = self.cfg["ips"][self.name]
        tls = self.cfg["engine"] == "libtorrent-tls"
        self.ses = lt.session(
            {
                # an "s" suffix: an SSL listen socket (SSL torrents accept only those)
                "listen_interfaces": f"{ip}:{self.cfg['peer_port']}{'s' if tls else ''}",
                "enable_dht": False,
                "enable_lsd": False,
                "enable_upnp": False,
                "enable_natpmp": False,
                "enable_incoming_utp": False,
                "enable_outgoing_utp": False,
                "in_enc_policy": int(lt.enc_policy.disabled),
                "out_enc_policy": int(lt.enc_policy.disabled),
                "user_agent": "bootseer-spike",
                **LT_TUNING,
                **json.loads(os.environ.get("SPIKE_LT_SETTINGS", "{}")),
                **(
                    {"alert_mask": 0x7FFFFFFF}  # everything; show_stall prints what matters
                    if os.environ.get("SPIKE_DEBUG") == "1"
                    else {}
                ),
                "alert_mask": int(
                    lt.alert_category.error | lt.alert_category.status | lt.alert_category.storage
                ),
            }
        )
        atp = lt.add_torrent_params()
        atp.ti = lt.torrent_info(self.cfg["tls_torrent" if tls else "torrent"])
        atp.save_path = str(self.dir)
        atp.flags &= ~(lt.torrent_flags.auto_managed | lt.torrent_flags.paused)
        self.h = self.ses.add_torrent(atp)
        if tls:  # this node's certificate, signed by the job CA in the torrent
            d = Path(self.cfg["tls_dir"])
            self.h.set_ssl_certificate(
                str(d / f"{self.name}.pem"), str(d / f"{self.name}.key"), str(d / "dh.pem")
            )
        n = atp.ti.num_pieces()
        if n != len(self.digests):
            raise SystemExit(f"torrent has {n} pieces, manifest {len(self.digests)}")
        deadline = time.monotonic() + 30
        while self.h.status().state != lt.torrent_status.downloading:
            if time.monotonic() > deadline:
                raise SystemExit(f"torrent stuck in {self.h.status().state}")
            time.sleep(0.02)

    def run(self) -> None:
        # "one": each pair connects once, the later node in the list to the earlier.
        # "both": every node connects to every other; the two connections of a pair race
        # libtorrent's duplicate-connection check, which can drop both (see docs/p2p.md).
        both = self.cfg.get("lt_connect", "both") == "both"
        me = self.nodes.index(self.name)
        for k, peer in enumerate(self.nodes):
            if k < me or (both and k != me):
                self.h.connect_peer((self.cfg["ips"][peer], self.cfg["peer_port"]))
        mine = [i for i, o in enumerate(self.owner) if o == self.name]

        def feed(i: int) -> None:
            t = time.monotonic()
            data = self.store_get(i)
            t1 = time.monotonic()
            self.h.add_piece(i, data, 0)
            t2 = time.monotonic()
            if t2 - t > 10:
                self.say(f"slow feed {i}: store {t1 - t:.1f} s, add_piece {t2 - t1:.1f} s")

        pool = cf.ThreadPoolExecutor(STORE_SLOTS)
        futures = [pool.submit(feed, i) for i in mine]
        n = len(self.digests)
        t0 = time.monotonic()
        shown = 0.0
        debug = os.environ.get("SPIKE_DEBUG") == "1"
        while True:
            self.ses.wait_for_alert(20)
            for a in self.ses.pop_alerts():
                kind = type(a).__name__
                if a.category() & self.lt.alert_category.error or (
                    debug and kind in ("peer_disconnected_alert", "peer_error_alert",
                                       "peer_connect_alert", "incoming_connection_alert")
                ):  # fmt: skip
                    self.say(f"{time.monotonic() - t0:.2f} {kind} {a.message()}")
            if debug and time.monotonic() - t0 > 8 and time.monotonic() - shown > 2:
                shown = time.monotonic()
                self.show_stall(sum(not f.done() for f in futures))
            if self.h.status().num_pieces == n:
                break
            for f in futures:
                if f.done() and f.exception():
                    raise SystemExit(f"feed failed: {f.exception()}")
        pool.shutdown()
        st = self.h.status()
        self.stats["store_pieces"] = len(mine)
        self.stats["peer_pieces"] = n - len(mine)
        self.stats["payload_download"] = st.total_payload_download
        self.stats["payload_upload"] = st.total_payload_upload

    def say(self, text: str) -> None:
        print(f"{self.name} {text}", file=sys.stderr, flush=True)

    def show_stall(self, feeds_left: int) -> None:
        """SPIKE_DEBUG=1: what a node that should have finished is waiting for."""
        st = self.h.status()
        n = len(self.digests)
        missing = [(i, self.owner[i]) for i in range(n) if not self.h.have_piece(i)]
        self.say(f"stalled? {st.num_pieces}/{n}, missing {missing[:5]}, feeds left {feeds_left}")
        for p in self.h.get_peer_info():
            self.say(f"  peer {p.ip} flags {p.flags:x} has {p.num_pieces}")

    def verify(self) -> None:
        """Check what libtorrent wrote against the manifest (after the clock stopped).

        A piece libtorrent "has" may still sit in its write buffers: the file holds it
        only after a flush (``cache_flushed_alert``)."""
        self.h.flush_cache()
        deadline = time.monotonic() + 60
        flushed = False
        while not flushed:
            if time.monotonic() > deadline:
                raise SystemExit(f"{self.name}: no cache_flushed_alert")
            self.ses.wait_for_alert(100)
            flushed = any(isinstance(a, self.lt.cache_flushed_alert) for a in self.ses.pop_alerts())
        with open(self.dir / "hotset", "rb") as f:  # the torrent's one file
            for i, d in enumerate(self.digests):
                if hashlib.sha256(f.read(self.piece_len(i))).hexdigest() != d:
                    raise SystemExit(f"{self.name}: piece {i} bad on disk")


ENGINES: dict[str, type[Node]] = {
    "baseline": Baseline,
    "direct": Direct,
    "libtorrent": Torrent,
    "libtorrent-tls": Torrent,
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--node", required=True)
    a = ap.parse_args()
    cfg = json.loads(Path(a.config).read_text())
    node = ENGINES[cfg["engine"]](cfg, a.node)
    node.setup()
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit(1)
    c0, t0 = cpu_seconds(), time.monotonic()
    node.run()
    elapsed = time.monotonic() - t0
    print("done " + json.dumps({"elapsed_s": elapsed, **node.stats}), flush=True)
    if sys.stdin.readline().strip() != "stop":
        sys.exit(1)
    cpu = cpu_seconds() - c0
    if isinstance(node, Torrent):
        node.verify()
    print("cpu " + json.dumps({"cpu_s": cpu}), flush=True)


if __name__ == "__main__":
    main()
