"""A piece its owner is getting from the store is not read from the store a second time
(issue 24: store egress under load): an owner that heartbeats is waited for, whether
the owners' answer times are known or not. (An owner that sends nothing while late is
still hedged: tests/p2p/test_hedge.py's trickling owner.)"""

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

# First guesses (seconds) for the owners' and the store's answer times: an owner that
# says nothing is late after 3.5 s on them; this one answers after SLOW (heartbeating).
PEER_GUESS, STORE_GUESS = 3.0, 0.5
SLOW = 5.0
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


def test_an_owner_getting_the_piece_is_waited_for_past_its_known_median(
    serve: Callable[..., PeerServer],
) -> None:
    """With the owners' answer times known (0.5 s: late after 4 s), an owner reading a
    piece from a loaded store (heartbeating from 1 s on) is twice past that bound, and
    still not raced: the store sends the piece once."""
    d, data = piece_owned_by("n1", ("n1", "n2"))

    def reads_the_store_slowly(req: PieceRequest, deadline: float) -> bytes:
        time.sleep(2 * SLOW)
        return data

    server = serve({JOB: ServedJob(LOOPBACK, reads_the_store_slowly)})
    swarm = swarm_to(server.port, timeout=TIMEOUT)
    for _ in range(KNOWN_AFTER):
        swarm.peer_late.record(0.5)
        swarm.store_late.record(0.5)
    from_store, reads = counting(data)
    assert fetch_piece(swarm, d, 1, from_store) == (data, "owner")
    assert reads == []
