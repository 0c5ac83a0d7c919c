"""Peers over real TCP on loopback: serve, authenticate, verify, drop the bad ones in time."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from bootseer.p2p.auth import job_token
from bootseer.p2p.client import PeerClient
from bootseer.p2p.owner import owner
from bootseer.p2p.server import PeerServer, ServedJob
from bootseer.p2p.swarm import Swarm
from bootseer.p2p.wire import PeerError, PieceRequest

KEY = b"site-key-" + b"x" * 32
JOB = 42
LOOPBACK = frozenset({"127.0.0.1"})


def piece_owned_by(node: str, nodes: tuple[str, ...]) -> tuple[str, bytes]:
    """Some bytes whose digest ``owner`` gives to ``node``."""
    while True:
        data = os.urandom(64 << 10)
        d = hashlib.sha256(data).hexdigest()
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


def swarm_to(port: int, node: str = "n2", job: int = JOB, timeout: float = 5.0) -> Swarm:
    return Swarm(
        job,
        node,
        ("n1", "n2"),
        job_token(KEY, job),
        lambda n: ("127.0.0.1", port),
        PeerClient(timeout=timeout),
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
            client.fetch(("127.0.0.1", server.port), PieceRequest(JOB, token.hex(), d, 1))
        assert err.value.kind == "refused"
    assert server.refused == 3 and server.served_pieces == 0


def test_an_address_outside_the_job_is_refused(serve: Callable[..., PeerServer]) -> None:
    d, data = piece_owned_by("n1", ("n1", "n2"))
    server = serve({JOB: ServedJob(frozenset({"10.9.9.9"}), provider({d: data}))})
    swarm = swarm_to(server.port)
    assert swarm.fetch(d, 1) is None
    assert server.refused == 1 and "refused" in swarm.stats.dropped["n1"]


def test_bad_bytes_are_refused_and_the_peer_dropped(serve: Callable[..., PeerServer]) -> None:
    d, data = piece_owned_by("n1", ("n1", "n2"))
    bad = bytes([data[0] ^ 1]) + data[1:]
    server = serve({JOB: ServedJob(LOOPBACK, provider({d: bad}))})
    swarm = swarm_to(server.port)
    assert swarm.fetch(d, 1) is None
    assert swarm.stats.corrupt == 1 and swarm.stats.peer_bytes == 0
    # Dropped: the next piece it owns goes straight to the store, no peer asked.
    assert swarm.owner(d) is None
    assert server.served_pieces == 1


def test_a_dead_peer_costs_no_wait(serve: Callable[..., PeerServer]) -> None:
    d, _ = piece_owned_by("n1", ("n1", "n2"))
    server = serve({})
    port = server.port
    server.close()
    t0 = time.monotonic()
    swarm = swarm_to(port)
    assert swarm.fetch(d, 1) is None
    assert time.monotonic() - t0 < 1.0
    assert "unreachable" in swarm.stats.dropped["n1"]


def test_a_hung_peer_is_dropped_within_the_timeout() -> None:
    """A peer that accepts and never answers (stopped, wedged) costs one timeout, once."""
    d, _ = piece_owned_by("n1", ("n1", "n2"))
    hung = socket.create_server(("127.0.0.1", 0))
    try:
        swarm = swarm_to(hung.getsockname()[1], timeout=0.5)
        t0 = time.monotonic()
        assert swarm.fetch(d, 1) is None
        assert 0.4 < time.monotonic() - t0 < 2.0
        assert "timeout" in swarm.stats.dropped["n1"]
    finally:
        hung.close()


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


def test_an_unknown_job_is_answered_after_the_wait(serve: Callable[..., PeerServer]) -> None:
    d, _ = piece_owned_by("n1", ("n1", "n2"))
    server = serve({}, job_wait=0.2)
    swarm = swarm_to(server.port)
    assert swarm.fetch(d, 1) is None
    assert "unknown" in swarm.stats.dropped["n1"]
