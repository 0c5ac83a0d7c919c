"""What a piece costs the tree's peer code, per piece: bounded, whatever the job's size.

With ten times as many pieces the tree was CPU-bound at 64 emulated nodes (docs/p2p.md,
"The tree's CPU per piece"): every piece is a request, a proof, a reply and a rate
recorded, on every node. These tests hold the per-piece work where it was cut to.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from bootseer.p2p import auth
from bootseer.p2p.client import PeerClient
from bootseer.p2p.linkrate import LinkRates
from bootseer.p2p.owner import TREES
from bootseer.p2p.server import PeerServer, ServedJob
from bootseer.p2p.wire import PeerError, PieceReply, PieceRequest

KEY = b"site-key-" + b"c" * 32
JOB = 4343
PIECES = 20


@pytest.fixture
def server() -> Iterator[tuple[PeerServer, dict[str, bytes]]]:
    """A server that holds nothing: every piece goes the slow way (``provide``), as a
    relay's do while the node above it is still getting them."""
    pieces = {}
    for _ in range(PIECES):
        data = os.urandom(1024)
        pieces[hashlib.sha256(data).hexdigest()] = data

    def provide(req: PieceRequest, deadline: float) -> bytes:
        if req.piece not in pieces:
            raise PeerError("missing", "no such piece")
        return pieces[req.piece]

    job = ServedJob(frozenset({"127.0.0.1"}), provide)
    s = PeerServer(("127.0.0.1", 0), KEY, {JOB: job}.get, lambda _: None)
    s.start()
    try:
        yield s, pieces
    finally:
        s.close()


def test_a_provided_piece_costs_one_proof_on_each_side(
    server: tuple[PeerServer, dict[str, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The asker proves each request once, the server checks it once, with the job's
    token derived once: two HMACs a piece. The server used to check a provided piece's
    proof twice (as it read it, and again as it answered), deriving the token each
    time: five HMACs a piece."""
    s, pieces = server
    token = auth.job_token(KEY, JOB)
    client = PeerClient(timeout=30.0)
    made = [0]
    new = hmac.new

    def counted(*args: Any, **kw: Any) -> hmac.HMAC:
        made[0] += 1
        return new(*args, **kw)

    monkeypatch.setattr(hmac, "new", counted)
    getattr(auth.job_token, "cache_clear", lambda: None)()  # derived within the count
    try:
        for digest, data in pieces.items():
            req = PieceRequest(JOB, "", digest, 0)
            assert client.fetch(("127.0.0.1", s.port), req, token) == data
    finally:
        client.close()
    assert s.requests == PIECES
    # one per piece asked, one per piece checked, and the job's token once
    assert made[0] <= 2 * PIECES + 1, f"{made[0]} HMACs for {PIECES} pieces"


class _Counted(threading.Condition):
    """The server's heartbeat condition, counting its wakes and waits."""

    notified = 0
    waits = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return super().wait(timeout)


def test_requests_waiting_for_their_pieces_wake_the_heartbeats_once_a_tick() -> None:
    """A request the server provides (a relay still getting the piece) used to wake the
    heartbeat thread as it came, and that thread then woke once per waiting request per
    heartbeat: a thread switch and two passes over every waiting request, per piece. Now
    it is woken only when nothing was waiting, and sends every heartbeat due within a
    tick at once."""
    release = threading.Event()
    pieces = {}
    for _ in range(PIECES):
        data = os.urandom(512)
        pieces[hashlib.sha256(data).hexdigest()] = data

    def provide(req: PieceRequest, deadline: float) -> bytes:
        release.wait(30.0)
        return pieces[req.piece]

    beat = 0.4
    job = ServedJob(frozenset({"127.0.0.1"}), provide)
    s = PeerServer(("127.0.0.1", 0), KEY, {JOB: job}.get, lambda _: None, heartbeat=beat)
    counted = s._beat = _Counted(s._lock)
    s.start()
    client = PeerClient(timeout=30.0)
    token = auth.job_token(KEY, JOB)
    got: list[bytes] = []
    askers = []
    try:
        for digest in pieces:  # one every 50 ms: their heartbeats due at 20 times
            req = PieceRequest(JOB, "", digest, 0)
            t = threading.Thread(
                target=lambda r=req: got.append(client.fetch(("127.0.0.1", s.port), r, token))
            )
            t.start()
            askers.append(t)
            time.sleep(0.05)
        time.sleep(5 * beat)
        release.set()
        for t in askers:
            t.join(30.0)
    finally:
        release.set()
        client.close()
        s.close()
    assert sorted(got) == sorted(pieces.values())
    assert counted.notified <= 2, f"woken {counted.notified} times for {PIECES} requests"
    # about 6 heartbeats of 0.4 s while they waited: at most 4 wakes each, plus slack
    assert counted.waits <= 40, f"{counted.waits} wakes of the heartbeat thread"


def test_a_peer_rate_costs_the_same_however_many_pieces_it_remembers() -> None:
    """A peer's rate (asked for every piece, by every link in its tree chain) is kept as
    running sums: asking it does not go over the remembered pieces. Summed each time, a
    window of 50,000 pieces for 8 peers took seconds for 200 questions."""
    rates = LinkRates(horizon=3600.0, window=50_000)
    peers = [f"n{i}" for i in range(8)]
    for k in range(50_000):
        for p in peers:
            rates.record(p, 4096, 0.01 * (1 + k % 3))
    t0 = time.process_time()
    for k in range(200):
        rates.record(peers[k % 8], 4096, 0.01)  # each one counts the medians again
        rates.slow(peers[(k + 1) % 8])
        rates.median()
    spent = time.process_time() - t0
    assert spent < 1.0, f"{spent:.2f} CPU-s for 200 rate questions"
    assert rates.rate("n0") == pytest.approx(4096 / 0.02, rel=0.01)


def test_a_piece_longer_than_the_window_ages_out_of_the_sums() -> None:
    """The running sums forget what the window and the horizon forget."""
    rates = LinkRates(horizon=3600.0, window=4, known_after=4)
    for _ in range(4):
        rates.record("a", 1000, 1.0)
    for _ in range(4):
        rates.record("a", 8000, 1.0)
    assert rates.rate("a") == pytest.approx(8000.0)
    gone = LinkRates(horizon=0.0, known_after=1)
    gone.record("a", 1000, 1.0)
    time.sleep(0.01)
    assert gone.rate("a") is None and gone.known() == {}


def _as_dataclass(obj: object, omit: dict[str, object]) -> dict[str, object]:
    """The message as ``dataclasses.asdict`` gives it, less the fields left out when
    empty (the way older versions framed them)."""
    doc = json.loads(json.dumps(dataclasses.asdict(obj)))  # type: ignore[call-overload]
    return {k: v for k, v in doc.items() if not (k in omit and v == omit[k])}


@pytest.mark.parametrize(
    "req",
    [
        PieceRequest(JOB, "ab" * 32, "cd" * 32, 1),
        PieceRequest(JOB, "", "cd" * 32, 2, "snap/k", 4096, 512, "s3://b", True, 7),
        PieceRequest(JOB, "", "ef" * 32, 0, tag=9, blocks=(3, 4, 5)),
        PieceRequest(JOB, "", "ef" * 32, 0, tag=9, blocks=(3, 4, 5), trees=TREES),
        PieceRequest(JOB, "", "ab" * 32, 1, trees=TREES),
    ],
)
def test_a_request_framed_by_hand_is_the_dataclass_framed(req: PieceRequest) -> None:
    """Framed by hand (no ``asdict``): every field, the same JSON, in the same order,
    ``blocks`` only for a run and ``trees`` only when said, as an older version sends
    them."""
    frame = req.frame("12" * 32, 5)
    doc = json.loads(frame[4:])
    want = _as_dataclass(
        dataclasses.replace(req, proof="12" * 32, tag=5), {"blocks": [], "trees": ""}
    )
    assert list(doc) == list(want) and doc == want
    assert PieceRequest.decode(doc) == dataclasses.replace(req, proof="12" * 32, tag=5)


@pytest.mark.parametrize(
    "reply",
    [
        PieceReply(size=4096, tag=3),
        PieceReply(error="missing", message="no", tag=1),
        PieceReply(pending=True, tag=2),
        PieceReply(size=30, tag=4, sizes=(10, 20), intake=123456),
    ],
)
def test_a_reply_framed_by_hand_is_the_dataclass_framed(reply: PieceReply) -> None:
    doc = json.loads(reply.encode()[4:])
    want = _as_dataclass(reply, {"sizes": [], "intake": 0})
    assert list(doc) == list(want) and doc == want
    assert PieceReply.decode(doc) == reply
