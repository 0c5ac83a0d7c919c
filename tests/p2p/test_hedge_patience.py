"""A piece its owner is getting from the store is not read from the store a second time
on a guess (issue 24: store egress under load): while the owners' answer times are not
yet known, an owner that heartbeats is waited for 4x the first guess, not the guess; a
known-late owner is hedged as the rule says."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from bootseer.p2p.fallback import fetch_piece
from bootseer.p2p.lateness import KNOWN_AFTER, Lateness
from bootseer.p2p.server import PeerServer, ServedJob
from bootseer.p2p.wire import PieceRequest
from tests.p2p.test_peers import JOB, LOOPBACK, piece_owned_by, serve, swarm_to

__all__ = ["serve"]

# First guesses (seconds) for the owners' and the store's answer times: an owner is late
# after 3.5 s on them, a heartbeating one after 4 x 3 + 0.5 = 12.5 s; this one answers
# after SLOW, 3.5 s past the first and 5.5 s before the second.
PEER_GUESS, STORE_GUESS = 3.0, 0.5
SLOW = 7.0
TIMEOUT = 60.0


def counting(data: bytes) -> tuple[Callable[[], bytes], list[float]]:
    reads: list[float] = []

    def from_store() -> bytes:
        reads.append(time.monotonic())
        return data

    return from_store, reads


def test_an_owner_getting_the_piece_is_not_raced_to_the_store_on_a_guess(
    serve: Callable[..., PeerServer],
) -> None:
    d, data = piece_owned_by("n1", ("n1", "n2"))
    released = threading.Event()

    def reads_the_store_slowly(req: PieceRequest, deadline: float) -> bytes:
        released.wait(SLOW)  # the server heartbeats meanwhile
        return data

    server = serve({JOB: ServedJob(LOOPBACK, reads_the_store_slowly)})
    swarm = swarm_to(server.port, timeout=TIMEOUT)
    swarm.peer_late = Lateness(initial=PEER_GUESS)
    swarm.store_late = Lateness(initial=STORE_GUESS)
    from_store, reads = counting(data)
    assert fetch_piece(swarm, d, 1, from_store) == (data, "owner")
    assert reads == []  # read once, by its owner
    assert not swarm.stats.dropped


def test_an_owner_known_to_be_late_while_getting_it_is_hedged(
    serve: Callable[..., PeerServer],
) -> None:
    """With the owners' answer times known (fast), a heartbeating owner far past them is
    late by the rule: the store is asked too, and wins."""
    d, data = piece_owned_by("n1", ("n1", "n2"))
    released = threading.Event()

    def slow(req: PieceRequest, deadline: float) -> bytes:
        released.wait(TIMEOUT / 2)
        return data

    server = serve({JOB: ServedJob(LOOPBACK, slow)})
    swarm = swarm_to(server.port, timeout=TIMEOUT)
    for _ in range(KNOWN_AFTER):
        swarm.peer_late.record(0.01)
        swarm.store_late.record(0.01)
    from_store, reads = counting(data)
    try:
        assert fetch_piece(swarm, d, 1, from_store) == (data, "store")
        assert len(reads) == 1
    finally:
        released.set()
