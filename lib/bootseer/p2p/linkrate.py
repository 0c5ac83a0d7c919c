"""How fast each peer's bytes come: a relay on a slow link is asked around, a busy one is not.

A piece from a peer is timed from its reply's header to its last byte (the client's
``on_received``): the data phase only, never the wait before it, which is a relay
getting the piece from its own parent or the store, or a node whose CPU is loaded
answering late. So a relay whose pieces are slow to *start* (busy, or waiting on the
nodes above it) is not slow; one whose pieces, once started, trickle in at a fraction
of what the node's other peers deliver is: its link is the bound, and every node below
it in a piece's tree would get the piece at that link's pace.

A peer is *slow* when its rate over its last few pieces is below the median of the
peers' rates divided by ``factor``, with at least ``known_after`` pieces timed for it and
three peers known (so a node's own loaded link, which slows every peer alike, makes
none slow). What it measured ages out after ``horizon`` seconds: a peer routed around
sends this node nothing more to time, so it is asked again once its pieces are
forgotten, and a link that was slow for a while is not held against it::

    >>> rates = LinkRates(horizon=60.0)
    >>> for _ in range(4):
    ...     rates.record("fast1", 65536, 0.1)
    ...     rates.record("fast2", 65536, 0.12)
    ...     rates.record("slow", 65536, 1.3)
    >>> rates.slow("slow"), rates.slow("fast1"), rates.slow("new")
    (True, False, False)
"""

from __future__ import annotations

import collections
import statistics
import threading
import time

# A peer is slow below this fraction of the median peer's rate: the emulator's slow
# nodes have a tenth of the others' link (issue 20's fault), shared with their own
# children; pieces of one link on a loaded node vary by 2-3x.
FACTOR = 4.0
KNOWN_AFTER = 4  # pieces timed before a peer's rate counts
WINDOW = 16  # pieces remembered per peer
PEERS_KNOWN = 3  # peers with a known rate before any is called slow
# The shortest data phase counted: a piece that came in one burst (a token bucket's, a
# socket buffer already full when the reader got to it) is not infinitely fast.
MIN_SECONDS = 1e-3


class LinkRates:
    def __init__(
        self,
        horizon: float,
        factor: float = FACTOR,
        known_after: int = KNOWN_AFTER,
        window: int = WINDOW,
    ) -> None:
        self.horizon = horizon
        self.factor = factor
        self.known_after = known_after
        self.window = window
        # peer -> (when, bytes, seconds) of its last pieces
        self._pieces: dict[str, collections.deque[tuple[float, int, float]]] = {}
        self._lock = threading.Lock()
        # The peers' median rate, and when it was worked out: once per piece timed (or
        # per second, for what ages out), not once per question (one per piece asked).
        self._median: float | None = None
        self._median_at = -1.0

    def record(self, peer: str, nbytes: int, seconds: float) -> None:
        """A piece of ``nbytes`` from ``peer`` whose bytes took ``seconds`` to come."""
        with self._lock:
            pieces = self._pieces.get(peer)
            if pieces is None:
                pieces = self._pieces[peer] = collections.deque(maxlen=self.window)
            pieces.append((time.monotonic(), nbytes, max(MIN_SECONDS, seconds)))
            self._median_at = -1.0

    def rate(self, peer: str) -> float | None:
        """Bytes a second over ``peer``'s recent pieces; None while too few are known."""
        with self._lock:
            return self._rate_locked(peer, time.monotonic())

    def known(self) -> dict[str, float]:
        """Every peer's rate that is known (bytes a second)."""
        now = time.monotonic()
        with self._lock:
            rates = {p: self._rate_locked(p, now) for p in list(self._pieces)}
        return {p: r for p, r in rates.items() if r is not None}

    def slow(self, peer: str) -> bool:
        """Whether ``peer``'s pieces come at under 1/``factor`` of the median peer's rate."""
        now = time.monotonic()
        with self._lock:
            mine = self._rate_locked(peer, now)
            if mine is None:
                return False
            if now - self._median_at > 1.0:
                known = [r for p in self._pieces if (r := self._rate_locked(p, now)) is not None]
                self._median = statistics.median(known) if len(known) >= PEERS_KNOWN else None
                self._median_at = now
            median = self._median
        return median is not None and mine * self.factor < median

    def _rate_locked(self, peer: str, now: float) -> float | None:
        pieces = self._pieces.get(peer)
        if pieces is None:
            return None
        while pieces and now - pieces[0][0] > self.horizon:
            pieces.popleft()
        if len(pieces) < self.known_after:
            return None
        return sum(b for _, b, _ in pieces) / sum(s for _, _, s in pieces)
