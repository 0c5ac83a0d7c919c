"""Where a job's piece is asked, in order, and when the next is asked too.

1. its **owner** among the job's nodes (none when this node owns it, or the owner was
   dropped): late after a few times the owners' usual answer time (``swarm.peer_late``)
   plus the store's (``swarm.store_late``: an owner may have to read the piece from the
   store first, and a second store read of it then only costs egress), so a straggler's
   pieces (a node on a slow link, a node far behind) go elsewhere while it is still
   serving; a fill's never go (the fill is in no hurry, and the owner holds fills back
   while its own job starts). An owner whose heartbeats say it is getting the piece
   itself (from the store) is waited for, never raced to the store
   (:func:`owner_patience`): the store would send that piece twice;
2. the **store** (or the image file, or a checkpoint target): late after a few times
   the store's usual (``swarm.store_late``);
3. the **nodes that may hold it** (:meth:`Swarm.rescue`: up to 3 live peers, asked for
   what they hold, never to fetch it): a store that is hung, slow or down costs no
   piece a node of the job holds.

All three are asked by :func:`bootseer.p2p.hedge.first`: the first answer wins, the
others' answers are dropped, and nobody is dropped for being late (issue 19's rule:
busy is not dead). The store is asked for a piece whose owner is only late with one of
``Swarm.store_hedges``'s few slots (at once when the owner cannot answer): when every
piece is late, the store's link being the bound, hedges would read each piece twice and
make it later still::

    >>> data, where = fetch_piece(swarm, digest, PREFETCH, from_store)  # doctest: +SKIP
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from bootseer.p2p.hedge import PEER_ASKS, STORE_READS, Source, first
from bootseer.p2p.swarm import BACKGROUND, Swarm

# "owner", "store" or "holder": where the bytes came from.
Where = str


def fetch_piece(
    swarm: Swarm,
    piece: str,
    priority: int,
    from_store: Callable[[], bytes],
    where: tuple[str, str, int, int] | None = None,
    root: int | None = None,
) -> tuple[bytes, Where]:
    """``piece``'s bytes and which source gave them. ``from_store`` reads and verifies it
    from the store (raising if it cannot); the peers' bytes are verified by the swarm.
    ``root``: the node its tree is rooted at, where not its owner by digest
    (:meth:`Swarm.source`). Raises the store's error if no source had it."""

    def store() -> bytes:
        t0 = time.monotonic()
        data = from_store()
        swarm.store_late.record(time.monotonic() - t0)
        return data

    sources: list[Source[bytes]] = []
    if swarm.source(piece, root) is not None:  # its owner, or a node above this one in its tree
        late = swarm.peer_late.bound() + swarm.store_late.bound()
        if priority >= BACKGROUND:
            late = float("inf")
        getting = threading.Event()
        sources.append(
            Source(
                "owner",
                lambda: swarm.fetch(piece, priority, where, on_pending=getting.set, root=root),
                late,
                PEER_ASKS,
                getting=getting,
                patient=lambda: owner_patience(swarm),
            )
        )
    # Asked while the owner is only late: with one of the job's few hedge slots here.
    sources.append(
        Source("store", store, swarm.store_late.bound(), STORE_READS, slots=swarm.store_hedges)
    )
    if len(swarm.nodes) > 1:
        sources.append(
            Source("holder", lambda: swarm.rescue(piece, priority, where), 0.0, PEER_ASKS)
        )
    return first(sources)


def owner_patience(swarm: Swarm) -> float:
    """Seconds from the ask after which an owner (or a node above) that is getting the
    piece itself (its heartbeats: it reads the store for it, or waits for its prolog) is
    late: never. Its answer, or its error (the piece timeout bounds it), decides: a
    second store read of a piece on its way costs its bytes again, and the owners'
    median, mostly cache hits, called every loaded owner's store read late (the 52-job
    load sent 1.25x the piece bytes with 4x that median as the bound, 1.02x without).
    An owner that says nothing is still late by the rule (a straggler's link)."""
    return float("inf")
