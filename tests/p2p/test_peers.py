"""Peers over real TCP on loopback: serve, authenticate, verify, drop the bad ones in time."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bootseer import digest
from bootseer.p2p.auth import job_token, prove
from bootseer.p2p.client import PeerClient
from bootseer.p2p.imagesource import PeerSource
from bootseer.p2p.owner import owner
from bootseer.p2p.server import PeerServer, ServedJob
from bootseer.p2p.swarm import Swarm
from bootseer.p2p.wire import (
    SILENCE,
    Hello,
    PeerError,
    PieceReply,
    PieceRequest,
    read_message,
    recv_exact,
)
from tests.waiting import wait_until

KEY = b"site-key-" + b"x" * 32
JOB = 42
LOOPBACK = frozenset({"127.0.0.1"})
LIB = Path(__file__).resolve().parents[2] / "lib"
TIMEOUT = 60.0  # a piece's timeout far beyond any wait a test expects, loaded or not


def piece_owned_by(
    node: str, nodes: tuple[str, ...], algorithm: digest.Algorithm = digest.CURRENT
) -> tuple[str, bytes]:
    """Some bytes whose digest (BLAKE3 unless told: what new pieces are named by)
    ``owner`` gives to ``node``."""
    while True:
        data = os.urandom(64 << 10)
        d = digest.of(data, algorithm)
        if owner(d, nodes) == node:
            return d, data


def provider(pieces: dict[str, bytes]) -> Callable[[PieceRequest, float], bytes]:
    def provide(req: PieceRequest, deadline: float) -> bytes:
        if req.piece not in pieces:
            raise PeerError("missing", f"{req.piece[:12]} is not a piece of job {JOB}")
        return pieces[req.piece]

    return provide


@pytest.fixture
def serve() -> Iterator[Callable[..., PeerServer]]:
    servers: list[PeerServer] = []

    def start(jobs: dict[int, ServedJob], **kw: float) -> PeerServer:
        s = PeerServer(("127.0.0.1", 0), KEY, jobs.get, lambda _: None, **kw)  # type: ignore[arg-type]
        s.start()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.close()


def swarm_to(
    port: int, node: str = "n2", job: int = JOB, timeout: float = 5.0, silence: float = SILENCE
) -> Swarm:
    return Swarm(
        job,
        node,
        ("n1", "n2"),
        job_token(KEY, job),
        lambda n: ("127.0.0.1", port),
        PeerClient(timeout=timeout, silence=silence),
        lambda _: None,
    )


def test_a_piece_comes_from_its_owner_verified(serve: Callable[..., PeerServer]) -> None:
    d, data = piece_owned_by("n1", ("n1", "n2"))
    server = serve({JOB: ServedJob(LOOPBACK, provider({d: data}))})
    swarm = swarm_to(server.port)
    assert swarm.fetch(d, 1) == data
    assert swarm.fetch(d, 1) == data  # again, on the kept connection
    assert swarm.stats.peer_bytes == 2 * len(data)
    assert server.served_pieces == 2


def test_the_owner_fetches_from_the_store_itself(serve: Callable[..., PeerServer]) -> None:
    d, _ = piece_owned_by("n2", ("n1", "n2"))
    server = serve({})
    assert swarm_to(server.port).fetch(d, 1) is None  # n2 owns it: no peer asked
    assert server.served_pieces == 0


def test_a_wrong_token_or_another_jobs_token_is_refused(serve: Callable[..., PeerServer]) -> None:
    d, data = piece_owned_by("n1", ("n1", "n2"))
    server = serve({JOB: ServedJob(LOOPBACK, provider({d: data}))})
    client = PeerClient(timeout=5)
    for token in (job_token(KEY, JOB + 1), job_token(b"another-key" * 3, JOB), b"\0" * 32):
        with pytest.raises(PeerError) as err:
            client.fetch(("127.0.0.1", server.port), PieceRequest(JOB, "", d, 1), token)
        assert err.value.kind == "refused"
    assert server.refused == 3 and server.served_pieces == 0


def test_an_address_outside_the_job_is_refused(serve: Callable[..., PeerServer]) -> None:
    d, data = piece_owned_by("n1", ("n1", "n2"))
    server = serve({JOB: ServedJob(frozenset({"10.9.9.9"}), provider({d: data}))})
    swarm = swarm_to(server.port)
    assert swarm.fetch(d, 1) is None
    assert server.refused == 1 and "refused" in swarm.stats.dropped["n1"]


@pytest.mark.parametrize("algorithm", digest.ALGORITHMS)
def test_bad_bytes_are_refused_and_the_peer_dropped(
    serve: Callable[..., PeerServer], algorithm: digest.Algorithm
) -> None:
    """A BLAKE3 piece, and one of a store written before (SHA-256): a flipped bit fails
    either's check on receipt."""
    d, data = piece_owned_by("n1", ("n1", "n2"), algorithm)
    assert digest.algorithm(d) == algorithm
    bad = bytes([data[0] ^ 1]) + data[1:]
    server = serve({JOB: ServedJob(LOOPBACK, provider({d: bad}))})
    swarm = swarm_to(server.port)
    assert swarm.fetch(d, 1) is None
    assert swarm.stats.corrupt == 1 and swarm.stats.peer_bytes == 0
    # Dropped: the next piece it owns goes straight to the store, no peer asked.
    assert swarm.owner(d) is None
    assert server.served_pieces == 1


def test_a_dead_peer_costs_no_wait(serve: Callable[..., PeerServer]) -> None:
    """A refused connection drops the peer at once: not silence waited out (the reason
    says which), and nowhere near the piece's timeout (a bound no loaded machine nears)."""
    d, _ = piece_owned_by("n1", ("n1", "n2"))
    server = serve({})
    port = server.port
    server.close()
    t0 = time.monotonic()
    swarm = swarm_to(port, timeout=TIMEOUT)
    assert swarm.fetch(d, 1) is None
    assert time.monotonic() - t0 < TIMEOUT / 2
    assert "unreachable" in swarm.stats.dropped["n1"]


def test_a_hung_peer_is_dropped_once_it_is_silent_for_the_silence_window() -> None:
    """A peer that accepts and never answers (wedged) costs ``silence`` seconds, once,
    however long a piece may take."""
    d, _ = piece_owned_by("n1", ("n1", "n2"))
    hung = socket.create_server(("127.0.0.1", 0))
    try:
        swarm = swarm_to(hung.getsockname()[1], timeout=TIMEOUT, silence=2.0)
        t0 = time.monotonic()
        assert swarm.fetch(d, 1) is None
        # Silence for the silence window, not the piece's whole timeout.
        assert 2.0 - 0.1 < time.monotonic() - t0 < TIMEOUT / 2
        assert "timeout" in swarm.stats.dropped["n1"]
    finally:
        hung.close()


def test_a_busy_owner_is_waited_for(serve: Callable[..., PeerServer]) -> None:
    """An owner whose store read takes longer than the silence window is not dropped:
    its heartbeats say it is alive."""
    d, data = piece_owned_by("n1", ("n1", "n2"))

    def slow_store(req: PieceRequest, deadline: float) -> bytes:
        time.sleep(3.0)  # the owner waits on a slow store: allowed in a unit test
        return data

    server = serve({JOB: ServedJob(LOOPBACK, slow_store)})
    swarm = swarm_to(server.port, timeout=30.0, silence=2.0)
    assert swarm.fetch(d, 1) == data
    assert not swarm.stats.dropped


def test_an_owner_still_getting_the_piece_at_its_bound_is_late_not_dropped(
    serve: Callable[..., PeerServer],
) -> None:
    """A relay waits on the nodes above it (or the store): one that heartbeats to the
    piece's bound is alive and busy. The asker goes elsewhere for that piece and keeps it
    (dropped for 30 s, every piece below it went to the store: 1436 MiB of store egress
    for a 16-node job that needs 231, at load 40-140)."""
    d, data = piece_owned_by("n1", ("n1", "n2"))
    release = threading.Event()

    def upstream_slow(req: PieceRequest, deadline: float) -> bytes:
        release.wait(TIMEOUT)
        return data

    server = serve({JOB: ServedJob(LOOPBACK, upstream_slow)})
    swarm = swarm_to(server.port, timeout=2.5, silence=2.0)
    try:
        assert swarm.fetch(d, 1) is None
    finally:
        release.set()
    assert not swarm.stats.dropped
    assert swarm.source(d) == "n1"  # still asked for its next piece


def test_an_owner_that_could_not_get_the_piece_is_kept(serve: Callable[..., PeerServer]) -> None:
    """ "failed": the owner answered that its own source failed it; it is alive."""
    d, _ = piece_owned_by("n1", ("n1", "n2"))

    def store_down(req: PieceRequest, deadline: float) -> bytes:
        raise PeerError("failed", "the store is down")

    server = serve({JOB: ServedJob(LOOPBACK, store_down)})
    swarm = swarm_to(server.port)
    assert swarm.fetch(d, 1) is None
    assert not swarm.stats.dropped


def test_a_request_waits_for_the_job_to_be_prepared(serve: Callable[..., PeerServer]) -> None:
    d, data = piece_owned_by("n1", ("n1", "n2"))
    jobs: dict[int, ServedJob] = {}
    server = serve(jobs, job_wait=5.0)

    def prepare() -> None:
        jobs[JOB] = ServedJob(LOOPBACK, provider({d: data}))
        server.jobs_changed()

    prepared = threading.Timer(0.3, prepare)
    prepared.start()
    assert swarm_to(server.port).fetch(d, 1) == data


def test_an_owner_whose_prolog_comes_late_is_waited_for_not_dropped(
    serve: Callable[..., PeerServer],
) -> None:
    """Busy is not dead: a loaded node's prolog may reach the job seconds after its peers
    ask it for pieces (26 drops in two loaded 16-node jobs with the old 5 s wait). The
    owner waits for it, heartbeating (the asker's silence bound, 2 s here, is shorter
    than the wait) and serves the piece; the asker keeps it."""
    d, data = piece_owned_by("n1", ("n1", "n2"))
    jobs: dict[int, ServedJob] = {}
    server = serve(jobs)  # the server's own wait for a job
    t0 = time.monotonic()

    def prepare_late() -> None:
        # Past the old 5 s and past the asker's silence bound, by the asker's clock.
        wait_until(lambda: time.monotonic() - t0 > 5.5, "5.5 s", timeout=TIMEOUT, interval=0.1)
        jobs[JOB] = ServedJob(LOOPBACK, provider({d: data}))
        server.jobs_changed()

    late = threading.Thread(target=prepare_late)
    late.start()
    swarm = swarm_to(server.port, timeout=TIMEOUT, silence=2.0)
    assert swarm.fetch(d, 1) == data
    assert not swarm.stats.dropped
    late.join()


def test_an_unknown_job_is_answered_after_the_wait(serve: Callable[..., PeerServer]) -> None:
    d, _ = piece_owned_by("n1", ("n1", "n2"))
    server = serve({}, job_wait=0.2)
    swarm = swarm_to(server.port)
    assert swarm.fetch(d, 1) is None
    assert "unknown" in swarm.stats.dropped["n1"]


def test_a_peer_source_counts_its_own_blocks_by_where_they_came_from(
    serve: Callable[..., PeerServer],
) -> None:
    from bootseer.p2p.imagesource import PeerSource

    theirs, data = piece_owned_by("n1", ("n1", "n2"))
    mine, own = piece_owned_by("n2", ("n1", "n2"))
    server = serve({JOB: ServedJob(LOOPBACK, provider({theirs: data}))})
    swarm = swarm_to(server.port)

    class Origin:
        def read_block(self, index: int, digest: str, offset: int, length: int, p: int) -> bytes:
            return own

        def describe(self) -> str:
            return "origin"

    source = PeerSource(Origin(), swarm)  # type: ignore[arg-type]
    assert source.read_block(0, theirs, 0, len(data), 1) == data
    assert source.read_block(1, mine, 0, len(own), 1) == own
    swarm.fetch(theirs, 1)  # another kind of piece through the same swarm: not the image's
    assert source.counts() == (len(own), len(data))
    assert swarm.stats.peer_bytes == 2 * len(data)


def test_a_peer_killed_mid_transfer_is_dropped_at_once() -> None:
    """A peer that dies after half a piece (its agent killed): the asker gets None at
    once, not after the timeout, and goes to the store."""
    d, data = piece_owned_by("n1", ("n1", "n2"))
    half_dead = socket.create_server(("127.0.0.1", 0))

    def serve_half() -> None:
        conn, _ = half_dead.accept()
        conn.sendall(Hello(os.urandom(16).hex()).encode())
        read_message(conn)
        conn.sendall(PieceReply(size=len(data)).encode() + data[: len(data) // 2])
        conn.close()

    t = threading.Thread(target=serve_half, daemon=True)
    t.start()
    try:
        swarm = swarm_to(half_dead.getsockname()[1], timeout=TIMEOUT)
        t0 = time.monotonic()
        assert swarm.fetch(d, 1) is None
        assert time.monotonic() - t0 < TIMEOUT / 2  # not the timeout waited out
        assert "closed after" in swarm.stats.dropped["n1"]  # nor the liveness window
        assert swarm.stats.peer_bytes == 0
    finally:
        half_dead.close()


def test_requests_cut_short_by_closing_this_nodes_client_drop_no_peer() -> None:
    """The agent stopping (a restart, an upgrade) closes its client with requests in
    flight: they fail, and the peers they were asking are not dropped for it (a 16-node
    bench's agents, stopped between runs, logged two such drops as faults of peers)."""
    d, _ = piece_owned_by("n1", ("n1", "n2"))
    holding = socket.create_server(("127.0.0.1", 0))
    asked = threading.Event()
    release = threading.Event()

    def hold() -> None:
        conn, _ = holding.accept()
        conn.sendall(Hello(os.urandom(16).hex()).encode())
        read_message(conn)
        asked.set()
        release.wait(TIMEOUT)
        conn.close()

    threading.Thread(target=hold, daemon=True).start()
    got: list[bytes | None] = []
    try:
        swarm = swarm_to(holding.getsockname()[1], timeout=TIMEOUT)
        asker = threading.Thread(target=lambda: got.append(swarm.fetch(d, 1)))
        asker.start()
        assert asked.wait(TIMEOUT)
        swarm.client.close()
        asker.join(TIMEOUT)
        assert got == [None]
        assert swarm.stats.dropped == {} and swarm.stats.peer_failures == 0
        assert swarm.owner(d) == "n1"  # not dead
    finally:
        release.set()
        holding.close()


@contextmanager
def trickling_peer(data: bytes, every: float) -> Iterator[int]:
    """A peer on a link far too slow: it answers the first request with ``data``, a byte
    every ``every`` seconds (alive, never silent); its port. Stopped on leaving."""
    slow = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def trickle() -> None:
        conn, _ = slow.accept()
        with conn:
            conn.sendall(Hello(os.urandom(16).hex()).encode())
            read_message(conn)
            conn.sendall(PieceReply(size=len(data)).encode())
            for b in data:
                if done.wait(every):
                    return
                conn.sendall(bytes([b]))

    threading.Thread(target=trickle, daemon=True).start()
    try:
        yield slow.getsockname()[1]
    finally:
        done.set()
        slow.close()


def test_a_peer_that_trickles_a_piece_is_bounded_by_the_piece_timeout() -> None:
    """Bytes still arriving keep a peer from being called silent, but not forever: a peer
    that trickles a piece (a byte every 0.2 s: alive, far too slow) is given up at the
    piece's timeout (2 s here), however long its silence bound."""
    d, data = piece_owned_by("n1", ("n1", "n2"))
    with trickling_peer(data, 0.2) as port:
        swarm = swarm_to(port, timeout=2.0, silence=TIMEOUT)
        t0 = time.monotonic()
        assert swarm.fetch(d, 1) is None
        assert 2.0 - 0.1 < time.monotonic() - t0 < TIMEOUT / 2
        assert "timeout" in swarm.stats.dropped["n1"]


class DownStore:
    """A block source whose store is down."""

    def read_block(self, index: int, digest: str, offset: int, length: int, priority: int) -> bytes:
        raise ConnectionError("store unreachable")

    def describe(self) -> str:
        return "a store that is down"


def test_a_store_that_is_down_while_a_peer_holds_the_piece(
    serve: Callable[..., PeerServer],
) -> None:
    """n2 owns the piece, so it would read the store; the store is down, and n1 (which
    holds the piece, from an earlier job) serves it from what it holds."""
    d, data = piece_owned_by("n2", ("n1", "n2"))
    asked: list[bool] = []

    def holder(req: PieceRequest, deadline: float) -> bytes:
        asked.append(req.cached_only)
        return data

    server = serve({JOB: ServedJob(LOOPBACK, holder)})
    source = PeerSource(DownStore(), swarm_to(server.port))
    assert source.read_block(0, d, 0, len(data), 1) == data
    assert asked == [True]  # a rescue asks for what the peer holds, never a fetch
    assert source.swarm.stats.store_bytes == 0


def test_the_store_error_stands_when_no_peer_holds_the_piece(
    serve: Callable[..., PeerServer],
) -> None:
    d, data = piece_owned_by("n2", ("n1", "n2"))
    server = serve({JOB: ServedJob(LOOPBACK, provider({}))})
    swarm = swarm_to(server.port)
    with pytest.raises(ConnectionError):
        PeerSource(DownStore(), swarm).read_block(0, d, 0, len(data), 1)
    assert "n1" not in swarm.stats.dropped  # not holding a piece is no fault


def test_a_captured_request_is_worth_nothing_on_another_connection(
    serve: Callable[..., PeerServer],
) -> None:
    """What a listener on a peer port sees (a request and its proof) cannot be replayed:
    each connection has its own nonce, and the token itself never crosses the wire."""
    d, data = piece_owned_by("n1", ("n1", "n2"))
    server = serve({JOB: ServedJob(LOOPBACK, provider({d: data}))})
    token = job_token(KEY, JOB)
    first = socket.create_connection(("127.0.0.1", server.port))
    nonce = Hello.decode(read_message(first))
    captured = PieceRequest(JOB, prove(token, nonce, JOB, d), d, 1)
    assert token.hex().encode() not in captured.encode()
    first.close()
    replay = socket.create_connection(("127.0.0.1", server.port))
    Hello.decode(read_message(replay))  # a new nonce
    replay.sendall(captured.encode())
    reply = PieceReply.decode(read_message(replay))
    replay.close()
    assert reply.error == "refused" and server.served_pieces == 0


def test_a_kept_connection_the_server_closed_is_replaced_not_blamed(
    serve: Callable[..., PeerServer],
) -> None:
    """The server closes idle connections; the next job's first request on the kept one
    meets EOF. That is retried on a fresh connection, and the peer is not dropped."""
    d, data = piece_owned_by("n1", ("n1", "n2"))
    server = serve({JOB: ServedJob(LOOPBACK, provider({d: data}))}, idle_timeout=0.2)
    swarm = swarm_to(server.port)
    assert swarm.fetch(d, 1) == data
    wait_until(lambda: not server._active, "the server closing the idle connection")
    assert swarm.fetch(d, 1) == data
    assert not swarm.stats.dropped and server.served_pieces == 2


def test_at_the_connection_cap_the_longest_idle_connection_gives_way(
    serve: Callable[..., PeerServer],
) -> None:
    """A job of many nodes keeps more connections than the cap: a new asker is served
    (the oldest idle connection is closed) and the evicted one's owner reconnects."""
    d, data = piece_owned_by("n1", ("n1", "n2"))
    server = serve({JOB: ServedJob(LOOPBACK, provider({d: data}))}, max_connections=2)
    swarms = [swarm_to(server.port) for _ in range(3)]
    for swarm in swarms:  # the third exceeds the cap of 2
        assert swarm.fetch(d, 1) == data
    assert swarms[0].fetch(d, 1) == data  # its kept connection was the one evicted
    assert not any(s.stats.dropped for s in swarms)
    assert server.served_pieces == 4


SERVE_ONE = f"""
import sys, threading, time
from bootseer.p2p.server import PeerServer, ServedJob
spin, hold = int(sys.argv[1]), float(sys.argv[2])
data = bytes.fromhex(sys.stdin.readline())
def burn():
    while True:
        pass
for _ in range(spin):
    threading.Thread(target=burn, daemon=True).start()
def provide(req, deadline):
    time.sleep(hold)
    return data
job = ServedJob(frozenset(["127.0.0.1"]), provide)
server = PeerServer(("127.0.0.1", 0), {KEY!r}, {{{JOB}: job}}.get, lambda _: None)
server.start()
print(server.port, flush=True)
sys.stdin.read()
"""


def serve_in_a_process(
    data: bytes, spin: int = 0, hold: float = 0.0
) -> tuple[subprocess.Popen[str], int]:
    """A peer agent of its own (a process the test can stop, kill or load) serving
    ``data`` for JOB; ``spin`` threads of it burn CPU (as the agent's own hashing does)
    and it takes ``hold`` seconds to get each piece (its store is slow)."""
    peer = subprocess.Popen(
        [sys.executable, "-c", SERVE_ONE, str(spin), str(hold)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(LIB)},
    )
    assert peer.stdin is not None and peer.stdout is not None
    peer.stdin.write(data.hex() + "\n")
    peer.stdin.flush()
    return peer, int(peer.stdout.readline())


def test_a_peer_stopped_longer_than_the_old_3s_rule_is_not_dropped() -> None:
    """Busy is not dead: a peer agent that gets no CPU for 4 s (stopped with SIGSTOP, the
    extreme of a loaded node) serves its piece once it runs again, and is not dropped.
    Under the old rule (silent 3 s) it was dropped and the node went to the store."""
    d, data = piece_owned_by("n1", ("n1", "n2"))
    peer, port = serve_in_a_process(data)
    try:
        peer.send_signal(signal.SIGSTOP)
        resume = threading.Timer(4.0, peer.send_signal, (signal.SIGCONT,))
        resume.start()
        swarm = swarm_to(port, timeout=TIMEOUT)
        assert swarm.fetch(d, 1) == data
        assert not swarm.stats.dropped
        resume.join()
    finally:
        peer.send_signal(signal.SIGCONT)
        peer.kill()
        peer.wait()


def connected_to(port: int) -> bool:
    """A connection to 127.0.0.1:``port`` is established (the kernel completes one while
    the listening process is stopped)."""
    want = f"0100007F:{port:04X}"
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return any(f[2] == want and f[3] == "01" for f in (r.split() for r in rows))


def test_a_peer_killed_while_asked_is_dropped_at_once() -> None:
    """A peer that is really gone (its agent killed while a request waits on it) is
    dropped as soon as its connection is reset, not after a bound: the asker's silence
    bound here is a minute, and the drop comes well before it."""
    d, data = piece_owned_by("n1", ("n1", "n2"))
    peer, port = serve_in_a_process(data)
    try:
        peer.send_signal(signal.SIGSTOP)
        swarm = swarm_to(port, timeout=TIMEOUT, silence=TIMEOUT)
        got: list[bytes | None] = []
        asker = threading.Thread(target=lambda: got.append(swarm.fetch(d, 1)))
        t0 = time.monotonic()
        asker.start()
        wait_until(lambda: connected_to(port), "the asker's connection", timeout=TIMEOUT)
        peer.kill()
        peer.wait()
        asker.join(TIMEOUT)
        assert got == [None]
        assert time.monotonic() - t0 < TIMEOUT / 2  # the reset ended it, not a bound
        assert "unreachable" in swarm.stats.dropped["n1"]
    finally:
        peer.kill()
        peer.wait()


def test_a_peer_whose_cpu_is_busy_keeps_serving_and_is_never_dropped() -> None:
    """The CPU-load variant: an owner whose own threads keep its CPU busy (4 spinning)
    and whose store takes 2.5 s a piece serves 8 askers at once under the default
    silence bound; none is dropped, each gets its piece."""
    d, data = piece_owned_by("n1", ("n1", "n2"))
    peer, port = serve_in_a_process(data, spin=4, hold=2.5)
    try:
        swarms = [swarm_to(port, timeout=TIMEOUT) for _ in range(8)]
        got: list[bytes | None] = []
        askers = [threading.Thread(target=lambda s=s: got.append(s.fetch(d, 1))) for s in swarms]
        for a in askers:
            a.start()
        for a in askers:
            a.join()
        assert got == [data] * 8
        assert not any(s.stats.dropped for s in swarms)
    finally:
        peer.kill()
        peer.wait()


def test_bytes_that_arrived_count_though_the_asker_woke_past_its_deadline() -> None:
    """An asker not scheduled until after its deadline (its own node busy) still takes
    what the peer sent in time, instead of blaming the peer."""
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b"0123456789")
        assert recv_exact(a, 10, time.monotonic() - 1.0) == b"0123456789"
        with pytest.raises(TimeoutError):
            recv_exact(a, 1, time.monotonic() - 1.0)
