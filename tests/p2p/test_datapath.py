"""The peer data path's fast parts: a held piece sent from its file, a piece taken with one
receive, a block hashed once. Each keeps the rules: bytes a peer sends are verified before
they are used, a frame of the wrong size is refused, waits stay bounded."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bootseer.digest import matches as digest_matches
from bootseer.directio import Buffers, aligned_at
from bootseer.image.cache import BlockCache
from bootseer.image.fetch import PREFETCH, Fetcher
from bootseer.image.manifest import Manifest
from bootseer.p2p import imagesource
from bootseer.p2p.client import PeerClient
from bootseer.p2p.imagesource import PeerSource
from bootseer.p2p.server import HeldPiece, PeerServer, ServedJob
from bootseer.p2p.swarm import Swarm
from bootseer.p2p.wire import (
    HEARTBEAT,
    MAX_PIECE,
    Hello,
    PeerError,
    PieceReply,
    PieceRequest,
    read_message,
    recv_into_alive,
    recv_piece,
)
from tests.benchrun import run_bench

from .test_peers import JOB, KEY, LOOPBACK, TIMEOUT, piece_owned_by, swarm_to


@pytest.fixture
def serve() -> Iterator[Callable[..., PeerServer]]:
    servers: list[PeerServer] = []

    def start(job: ServedJob, heartbeat: float = HEARTBEAT) -> PeerServer:
        s = PeerServer(("127.0.0.1", 0), KEY, {JOB: job}.get, lambda _: None, heartbeat=heartbeat)
        s.start()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.close()


FIRST, FIRST_DATA = piece_owned_by("n1", ("n1", "n2"))


def never(req: PieceRequest, deadline: float) -> bytes:
    """The job's first request goes to provide (under heartbeats: the job's prolog may
    still be coming); a held piece asked for after it must not."""
    if req.piece == FIRST:
        return FIRST_DATA
    raise AssertionError("a held piece must not go to provide")


def first(swarm: Swarm) -> Swarm:
    assert swarm.fetch(FIRST, 1) == FIRST_DATA
    return swarm


def holding(
    d: str, path: Path, size: int, offset: int = 0
) -> Callable[[PieceRequest], HeldPiece | None]:
    return lambda req: HeldPiece(path, size, offset) if req.piece == d else None


def test_a_held_piece_is_sent_from_its_file(
    serve: Callable[[ServedJob], PeerServer], tmp_path: Path
) -> None:
    d, data = piece_owned_by("n1", ("n1", "n2"))
    (tmp_path / d).write_bytes(data)
    server = serve(ServedJob(LOOPBACK, never, holding(d, tmp_path / d, len(data))))
    swarm = first(swarm_to(server.port))
    assert swarm.fetch(d, 1) == data
    assert swarm.fetch(d, 1) == data  # on the kept connection: the stream stayed in step


def test_a_held_piece_is_sent_from_its_place_in_a_pack(
    serve: Callable[[ServedJob], PeerServer], tmp_path: Path
) -> None:
    """The cache's pack holds other blocks before and after it: only the piece's bytes go."""
    d, data = piece_owned_by("n1", ("n1", "n2"))
    (tmp_path / "pack").write_bytes(b"a" * 8192 + data + b"b" * 5000)
    server = serve(ServedJob(LOOPBACK, never, holding(d, tmp_path / "pack", len(data), 8192)))
    swarm = first(swarm_to(server.port))
    assert swarm.fetch(d, 1) == data
    assert swarm.fetch(d, 1) == data
    assert server.served_pieces == 3
    assert server.served_bytes == 2 * len(data) + len(FIRST_DATA)


def test_a_held_piece_with_a_wrong_byte_is_refused_and_the_peer_dropped(
    serve: Callable[[ServedJob], PeerServer], tmp_path: Path
) -> None:
    """sendfile does not look at the bytes; the asker's digest check does."""
    d, data = piece_owned_by("n1", ("n1", "n2"))
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 1
    (tmp_path / d).write_bytes(bad)
    server = serve(ServedJob(LOOPBACK, never, holding(d, tmp_path / d, len(data))))
    swarm = first(swarm_to(server.port))
    assert swarm.fetch(d, 1) is None
    assert swarm.stats.corrupt == 1 and swarm.stats.peer_bytes == len(FIRST_DATA)
    assert "do not match" in swarm.stats.dropped["n1"]


@pytest.mark.parametrize("damage", ["shorter", "gone"])
def test_a_held_file_that_ends_before_the_piece_goes_to_provide(
    serve: Callable[[ServedJob], PeerServer], tmp_path: Path, damage: str
) -> None:
    d, data = piece_owned_by("n1", ("n1", "n2"))
    if damage != "gone":
        (tmp_path / d).write_bytes(data[:-1])
    asked: list[str] = []

    def provide(req: PieceRequest, deadline: float) -> bytes:
        asked.append(req.piece)
        return data if req.piece == d else never(req, deadline)

    server = serve(ServedJob(LOOPBACK, provide, holding(d, tmp_path / d, len(data))))
    assert first(swarm_to(server.port)).fetch(d, 1) == data
    assert asked == [FIRST, d]


def test_a_jobs_first_request_goes_to_provide_the_next_from_the_file(
    serve: Callable[[ServedJob], PeerServer], tmp_path: Path
) -> None:
    """The first request of a job waits for it under heartbeats (its prolog on this node
    may still be coming, and the job's node names are resolved then); after it, a held
    piece is sent from its file without asking provide."""
    (tmp_path / FIRST).write_bytes(FIRST_DATA)
    asked: list[str] = []

    def provide(req: PieceRequest, deadline: float) -> bytes:
        asked.append(req.piece)
        return FIRST_DATA

    server = serve(ServedJob(LOOPBACK, provide, holding(FIRST, tmp_path / FIRST, len(FIRST_DATA))))
    swarm = swarm_to(server.port)
    assert swarm.fetch(FIRST, 1) == FIRST_DATA and asked == [FIRST]
    assert swarm.fetch(FIRST, 1) == FIRST_DATA and asked == [FIRST]


def test_a_bad_proof_is_refused_before_the_held_file_is_looked_at(
    serve: Callable[[ServedJob], PeerServer], tmp_path: Path
) -> None:
    d, _ = piece_owned_by("n1", ("n1", "n2"))
    looked: list[str] = []

    def held(req: PieceRequest) -> HeldPiece | None:
        looked.append(req.piece)
        return None

    server = serve(ServedJob(LOOPBACK, never, held))
    with pytest.raises(PeerError) as err:
        PeerClient(timeout=5).fetch(
            ("127.0.0.1", server.port), PieceRequest(JOB, "", d, 1), b"\0" * 32
        )
    assert err.value.kind == "refused" and looked == [] and server.refused == 1


def one_reply(reply: bytes) -> tuple[socket.socket, threading.Thread]:
    """A fake peer that answers one request with ``reply`` and closes."""
    srv = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.sendall(Hello(os.urandom(16).hex()).encode())
            read_message(conn)
            conn.sendall(reply)

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    return srv, t


def test_an_oversized_frame_is_refused() -> None:
    d, _ = piece_owned_by("n1", ("n1", "n2"))
    srv, t = one_reply(PieceReply(size=MAX_PIECE + 1).encode())
    with srv:
        with pytest.raises(PeerError) as err:
            PeerClient(timeout=5).fetch(srv.getsockname(), PieceRequest(JOB, "", d, 1), b"k" * 32)
        t.join()
    assert err.value.kind == "protocol" and "out of bounds" in str(err.value)


def test_a_frame_of_another_size_than_the_located_piece_is_refused() -> None:
    """A located piece's size is in the request: a reply of another size is not read."""
    d, data = piece_owned_by("n1", ("n1", "n2"))
    srv, t = one_reply(PieceReply(size=len(data) + 1).encode() + data + b"x")
    req = PieceRequest(JOB, "", d, 1, "deps/u/k/data.tar.zst", 0, len(data))
    with srv:
        with pytest.raises(PeerError) as err:
            PeerClient(timeout=5).fetch(srv.getsockname(), req, b"k" * 32)
        t.join()
    assert err.value.kind == "protocol" and f"for a {len(data)}-byte piece" in str(err.value)


def test_a_piece_answered_as_a_run_still_comes_as_bytes() -> None:
    """Only a run's reply goes into a run buffer: a peer that answers a piece's request
    with a run's sizes gives the asker bytes as before (which it checks by the digest)."""
    d, data = piece_owned_by("n1", ("n1", "n2"))
    srv, t = one_reply(PieceReply(size=len(data), sizes=(len(data),)).encode() + data)
    with srv:
        client = PeerClient(timeout=5)
        got = client.fetch(srv.getsockname(), PieceRequest(JOB, "", d, 1), b"k" * 32)
        t.join()
    assert got == data and isinstance(got, bytes) and client.buffers.made == 0


def test_a_short_frame_is_refused() -> None:
    a, b = socket.socketpair()
    with a:
        b.sendall(b"x" * 1000)
        b.close()
        with pytest.raises(PeerError) as err:
            recv_piece(a, 4096, time.monotonic() + TIMEOUT)
    assert err.value.kind == "protocol" and "after 1000 of 4096" in str(err.value)


def test_a_piece_comes_whole_in_one_receive_or_by_parts() -> None:
    a, b = socket.socketpair()
    data = os.urandom(1 << 20)
    with a, b:
        sender = threading.Thread(target=b.sendall, args=(data,))
        sender.start()
        got = recv_piece(a, len(data), time.monotonic() + TIMEOUT)
        sender.join()
        assert got == data and isinstance(got, bytes)
        b.sendall(data[:10])  # a trickle: the rest comes after a pause

        def rest() -> None:
            time.sleep(0.2)  # a slow sender, not a wait for a condition
            b.sendall(data[10:100])

        threading.Thread(target=rest).start()
        assert recv_piece(a, 100, time.monotonic() + TIMEOUT) == data[:100]


def test_a_runs_bytes_come_into_its_buffer_whole_or_by_parts_until_silence() -> None:
    """A run's reply is received into the caller's page-aligned buffer (recv_into_alive):
    whole at once, or as it trickles in; silence for the bound ends it (TimeoutError),
    and so does a close before the end (PeerError)."""
    buffers = Buffers(keep=1)
    data = os.urandom(1 << 20)
    a, b = socket.socketpair()
    with a, b:
        view = memoryview(buffers.get(len(data)))[: len(data)]
        sender = threading.Thread(target=b.sendall, args=(data,))
        sender.start()
        recv_into_alive(a, view, silence=TIMEOUT)
        sender.join()
        assert view == data and aligned_at(view)
        b.sendall(data[:10])

        def rest() -> None:
            time.sleep(0.2)  # a slow sender, not a wait for a condition
            b.sendall(data[10:100])

        threading.Thread(target=rest).start()
        recv_into_alive(a, view[:100], silence=TIMEOUT)
        assert view[:100] == data[:100]
        b.sendall(b"0123")
        with pytest.raises(TimeoutError) as err:
            recv_into_alive(a, view[:10], silence=0.3)
        assert "4 of 10" in str(err.value)
        b.sendall(b"01")
        b.close()
        with pytest.raises(PeerError) as perr:
            recv_into_alive(a, view[:10], silence=TIMEOUT)
        assert perr.value.kind == "protocol" and "after 2 of 10" in str(perr.value)


def test_a_trickle_past_the_deadline_times_out_and_what_came_in_time_counts() -> None:
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b"0123")
        t0 = time.monotonic()
        with pytest.raises(TimeoutError) as err:
            recv_piece(a, 10, t0 + 0.3)
        assert "4 of 10" in str(err.value) and time.monotonic() - t0 < TIMEOUT
        b.sendall(b"0123456789")
        assert recv_piece(a, 10, time.monotonic() - 1.0) == b"0123456789"  # already here


class BadStore:
    def read_block(self, index: int, digest: str, offset: int, length: int, prio: int) -> bytes:
        return b"not the block"

    def describe(self) -> str:
        return "a store that lies"


def test_a_peer_block_is_hashed_once_and_the_origins_blocks_still_are(
    serve: Callable[[ServedJob], PeerServer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    d, data = piece_owned_by("n1", ("n1", "n2"))
    (tmp_path / d).write_bytes(data)
    server = serve(ServedJob(LOOPBACK, never, holding(d, tmp_path / d, len(data))))
    source = PeerSource(BadStore(), first(swarm_to(server.port)))
    hashed: list[int] = []

    def counted(b: bytes, d: str) -> bool:
        hashed.append(len(b))
        return digest_matches(b, d)

    monkeypatch.setattr(imagesource, "digest_matches", counted)
    got = source.read_block(0, d, 0, len(data), PREFETCH)
    assert got == data and source.matches(got, d) and hashed == []  # the swarm's check only
    # The origin's bytes (the owner is this node) are checked, and refused.
    mine, _ = piece_owned_by("n2", ("n1", "n2"))
    bad = source.read_block(1, mine, 0, 64 << 10, PREFETCH)
    assert not source.matches(bad, mine) and hashed == [len(bad)]
    # Verified bytes are not taken for another block's.
    assert not source.matches(got, mine)


def test_the_fetcher_refuses_an_origins_bad_block_behind_a_peer_source(
    serve: Callable[[ServedJob], PeerServer], tmp_path: Path
) -> None:
    mine, _ = piece_owned_by("n2", ("n1", "n2"))
    server = serve(ServedJob(LOOPBACK, never))
    cache = BlockCache(tmp_path / "cache", cap_bytes=1 << 30)
    fetcher = Fetcher(cache, workers=1, timeout=0.5)
    try:
        fut = fetcher.request(
            PeerSource(BadStore(), swarm_to(server.port)),
            Manifest(64 << 10, 64 << 10, (mine,)),
            0,
            PREFETCH,
        )
        with pytest.raises(Exception, match="digest mismatch"):
            fut.result(timeout=TIMEOUT)
    finally:
        fetcher.stop()
    assert fetcher.stats.corrupt >= 1 and mine not in cache


def test_the_datapath_bench_smoke(tmp_path: Path) -> None:
    """slurm-dev/bench/p2p/datapath.py at its smoke size: every byte from the peer, both
    sides' CPU counted. No speed is asserted: figures come from the bench's own runs."""
    out = tmp_path / "out.json"
    run_bench(
        "p2p/datapath.py",
        "--smoke",
        "--work",
        str(tmp_path / "work"),
        "--json",
        str(out),
        timeout=300,
    )
    (run,) = json.loads(out.read_text())["runs"]
    assert run["bytes"] == 32 << 20 and run["pieces"] == 128
    assert run["sender_cpu_s_per_gib"] > 0 and run["receiver_cpu_s_per_gib"] > 0
    assert not (tmp_path / "work" / "send").exists()
