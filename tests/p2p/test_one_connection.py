"""One connection per peer pair, kept for the job and carrying many requests at once
(issue 20: handshakes per node per job about 2 log2 N, not one per piece or burst)."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bootseer.p2p.auth import job_token
from bootseer.p2p.client import PeerClient
from bootseer.p2p.server import HeldPiece, PeerServer, ServedJob
from bootseer.p2p.wire import PeerError, PieceRequest
from tests.p2p.test_datapath import serve
from tests.p2p.test_peers import JOB, KEY, LOOPBACK, TIMEOUT
from tests.waiting import wait_until

__all__ = ["serve"]  # the fixture, shared with test_datapath


def pieces(n: int, size: int = 16 << 10) -> dict[str, bytes]:
    out = {}
    for _ in range(n):
        data = os.urandom(size)
        out[hashlib.sha256(data).hexdigest()] = data
    return out


def test_one_connection_carries_every_piece_of_a_job(
    serve: Callable[[ServedJob], PeerServer], tmp_path: Path
) -> None:
    """48 pieces asked by 16 threads at once, then 16 more one by one: one handshake on
    each side, half the pieces sent from held files, half provided."""
    ps = pieces(64)
    held = dict(list(ps.items())[:32])
    for d, data in held.items():
        (tmp_path / d).write_bytes(data)

    def provide(req: PieceRequest, deadline: float) -> bytes:
        return ps[req.piece]

    def held_piece(req: PieceRequest) -> HeldPiece | None:
        return HeldPiece(tmp_path / req.piece, len(held[req.piece])) if req.piece in held else None

    server = serve(ServedJob(LOOPBACK, provide, held_piece))
    client = PeerClient(timeout=TIMEOUT)
    token = job_token(KEY, JOB)
    addr = ("127.0.0.1", server.port)
    digests = list(ps)
    try:
        with ThreadPoolExecutor(16) as pool:
            got = list(pool.map(lambda d: client.fetch(addr, PieceRequest(JOB, "", d, 1), token),
                                digests[:48]))  # fmt: skip
        assert got == [ps[d] for d in digests[:48]]
        for d in digests[48:]:
            assert client.fetch(addr, PieceRequest(JOB, "", d, 1), token) == ps[d]
        assert client.connects == 1 and client.most_open == 1
        assert server.accepted == 1 and server.served_pieces == 64
    finally:
        client.close()


def test_requests_on_one_connection_are_answered_at_once_in_any_order(
    serve: Callable[[ServedJob], PeerServer],
) -> None:
    """Eight requests whose answers each wait for all eight to be asked (a barrier in
    ``provide``) are answered, over one connection: they are in flight together, not one
    after another. A piece that waits behind them is not held up by them."""
    ps = pieces(9)
    digests = list(ps)
    slow = set(digests[:8])
    together = threading.Barrier(8, timeout=TIMEOUT)
    fast_done = threading.Event()

    def provide(req: PieceRequest, deadline: float) -> bytes:
        if req.piece in slow:
            together.wait()
            fast_done.wait(TIMEOUT)  # the fast one, asked last, comes back first
        return ps[req.piece]

    server = serve(ServedJob(LOOPBACK, provide))
    client = PeerClient(timeout=TIMEOUT)
    token = job_token(KEY, JOB)
    addr = ("127.0.0.1", server.port)
    try:
        with ThreadPoolExecutor(8) as pool:
            slow_ones = [
                pool.submit(client.fetch, addr, PieceRequest(JOB, "", d, 1), token)
                for d in digests[:8]
            ]
            assert client.fetch(addr, PieceRequest(JOB, "", digests[8], 1), token) == ps[digests[8]]
            fast_done.set()
            assert [f.result() for f in slow_ones] == [ps[d] for d in digests[:8]]
        assert client.connects == 1 and server.accepted == 1
    finally:
        fast_done.set()
        client.close()


def test_a_refused_request_ends_the_connection_and_the_next_makes_a_new_one(
    serve: Callable[[ServedJob], PeerServer],
) -> None:
    """A refusal closes the connection (the asker learns nothing more on it); the job's
    next request, rightly proved, is served on a new one."""
    ps = pieces(1)
    ((d, data),) = ps.items()
    server = serve(ServedJob(LOOPBACK, lambda req, deadline: ps[req.piece]))
    client = PeerClient(timeout=TIMEOUT)
    addr = ("127.0.0.1", server.port)
    try:
        assert client.fetch(addr, PieceRequest(JOB, "", d, 1), job_token(KEY, JOB)) == data
        with pytest.raises(PeerError) as err:
            client.fetch(addr, PieceRequest(JOB, "", d, 1), job_token(KEY, JOB + 1))
        assert err.value.kind == "refused" and server.refused == 1
        assert client.fetch(addr, PieceRequest(JOB, "", d, 1), job_token(KEY, JOB)) == data
        assert client.connects == 2 and server.served_pieces == 2
    finally:
        client.close()


def test_an_asker_at_the_connection_bound_takes_the_first_connection_to_go_idle(
    serve: Callable[[ServedJob], PeerServer],
) -> None:
    """A client bound to one connection, busy with one peer: its request to another peer
    waits, and goes out as soon as the first connection has nothing in flight (it is
    closed to make room), well before the request's time runs out."""
    ps = pieces(2)
    first, second = list(ps)
    release = threading.Event()

    def held_back(req: PieceRequest, deadline: float) -> bytes:
        release.wait(TIMEOUT)
        return ps[req.piece]

    a = serve(ServedJob(LOOPBACK, held_back))
    b = serve(ServedJob(LOOPBACK, lambda req, deadline: ps[req.piece]))
    client = PeerClient(timeout=TIMEOUT, max_open=1)
    token = job_token(KEY, JOB)
    try:
        with ThreadPoolExecutor(2) as pool:
            busy = pool.submit(
                client.fetch, ("127.0.0.1", a.port), PieceRequest(JOB, "", first, 1), token
            )
            wait_until(lambda: a.accepted == 1, "the first connection")
            other = pool.submit(
                client.fetch, ("127.0.0.1", b.port), PieceRequest(JOB, "", second, 1), token
            )
            release.set()
            assert busy.result() == ps[first] and other.result() == ps[second]
        assert client.most_open == 1 and client.connects == 2
    finally:
        release.set()
        client.close()


def test_provided_pieces_are_answered_by_a_few_threads_kept(
    serve: Callable[[ServedJob], PeerServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each piece the owner had to get first (``provide``) was answered by two threads
    started for it, one getting it, one heartbeating: 2 per piece, ~620 in one 2-node
    job with the agent's socket's. Now a bounded pool of kept threads gets the pieces and
    one thread sends every request's heartbeats: the threads started in this process
    over 239 pieces, 119 asked one by one and 120 16 at a time, are counted (238
    before)."""
    ps = pieces(240)
    digests = list(ps)
    server = serve(ServedJob(LOOPBACK, lambda req, deadline: ps[req.piece]))
    client = PeerClient(timeout=TIMEOUT)
    token = job_token(KEY, JOB)
    addr = ("127.0.0.1", server.port)
    started: list[str] = []
    start = threading.Thread.start

    def counted(self: threading.Thread) -> None:
        started.append(self.name)
        start(self)

    def fetch(d: str) -> bytes:
        return client.fetch(addr, PieceRequest(JOB, "", d, 1), token)

    try:
        assert fetch(digests[0]) == ps[digests[0]]  # the connection, its threads
        monkeypatch.setattr(threading.Thread, "start", counted)
        for d in digests[1:120]:
            assert fetch(d) == ps[d]
        assert len(started) <= 1, started  # the pool's first thread, if not yet started
        with ThreadPoolExecutor(16) as pool:
            assert list(pool.map(fetch, digests[120:])) == [ps[d] for d in digests[120:]]
        providers = [n for n in started if n.startswith("peer-provide")]
        assert len(providers) <= 16, started  # at most one per request at once
        assert server.served_pieces == 240
    finally:
        client.close()


def test_requests_waiting_for_a_provider_hear_heartbeats(
    serve: Callable[[ServedJob], PeerServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the pool's threads, a request waits its turn, and its asker hears it is
    pending meanwhile (busy is not dead): two providers, four slow pieces at once."""
    monkeypatch.setattr("bootseer.p2p.server.PROVIDERS", 2)
    ps = pieces(4)
    digests = list(ps)
    release = threading.Event()

    def slow(req: PieceRequest, deadline: float) -> bytes:
        release.wait(TIMEOUT)
        return ps[req.piece]

    server = serve(ServedJob(LOOPBACK, slow))
    client = PeerClient(timeout=TIMEOUT, silence=3.0)
    token = job_token(KEY, JOB)
    addr = ("127.0.0.1", server.port)
    beats = dict.fromkeys(digests, 0)

    def fetch(d: str) -> bytes:
        def heard() -> None:
            beats[d] += 1

        return client.fetch(addr, PieceRequest(JOB, "", d, 1), token, on_pending=heard)

    try:
        with ThreadPoolExecutor(4) as pool:
            got = [pool.submit(fetch, d) for d in digests]
            wait_until(lambda: min(beats.values()) >= 2, "two heartbeats for each request")
            assert server._providers.started == 2  # two waited for a thread, heartbeaten
            release.set()
            assert [f.result() for f in got] == [ps[d] for d in digests]
    finally:
        release.set()
        client.close()


def test_a_server_beats_at_the_heartbeat_it_was_given(serve: Callable[..., PeerServer]) -> None:
    """The heartbeat is the server's own (the many-node emulator stretches it with its
    scaled links): a server told 0.05 s beats many times while one at the default 1 s
    beats a few, both providing one slow piece at once."""
    ps = pieces(1)
    (digest,) = ps
    release = threading.Event()

    def slow(req: PieceRequest, deadline: float) -> bytes:
        release.wait(TIMEOUT)
        return ps[req.piece]

    fast = serve(ServedJob(LOOPBACK, slow), heartbeat=0.05)
    default = serve(ServedJob(LOOPBACK, slow))
    client = PeerClient(timeout=TIMEOUT, silence=3.0)
    token = job_token(KEY, JOB)
    beats = {fast.port: 0, default.port: 0}

    def fetch(port: int) -> bytes:
        def heard() -> None:
            beats[port] += 1

        req = PieceRequest(JOB, "", digest, 1)
        return client.fetch(("127.0.0.1", port), req, token, on_pending=heard)

    try:
        with ThreadPoolExecutor(2) as pool:
            got = [pool.submit(fetch, port) for port in beats]
            wait_until(lambda: beats[fast.port] >= 20, "20 heartbeats from the 0.05 s server")
            assert beats[default.port] * 4 <= beats[fast.port], beats
            release.set()
            assert [f.result() for f in got] == [ps[digest]] * 2
    finally:
        release.set()
        client.close()
