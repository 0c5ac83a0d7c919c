"""How fast each peer's bytes come, and its own: a relay on a slow link is asked around, a
busy one is not.

A relay on a slow link costs the nodes below it twice: it sends each piece slowly, and
it gets each piece slowly (its link is slow both ways), so it holds it late. Both are
measured as rates of bytes that are moving, never as waits:

- **sending**: a piece from a peer is timed from its reply's header to its last byte
  (the client's ``on_received``): the data phase only, never the wait before it, which
  is a relay getting the piece from its own parent or the store, or a node whose CPU
  is loaded answering late;
- **getting**: each reply carries the peer's *intake* (``PieceReply.intake``), the
  median rate it measured of its own peers' bytes (:meth:`LinkRates.median`). A node
  on a slow link sees every peer slow (its link is the bound), so it cannot tell a
  slow parent from its own link by the first measure; its peers' intakes tell it: a
  slow relay reports a tenth of what the others report.

A peer is *slow* when its rate is under 1/``factor`` of the median peer's, or its intake
under 1/``intake_factor`` of the median intake its peers told, with at least
``known_after`` pieces timed for it and three peers known (so a node's own loaded link,
which slows every peer alike, makes none slow).
What it measured ages out after ``horizon`` seconds: a peer routed around sends this
node nothing more to time, so it is asked again once its pieces are forgotten, and a
link that was slow for a while is not held against it::

    >>> rates = LinkRates(horizon=60.0)
    >>> for _ in range(4):
    ...     rates.record("fast1", 65536, 0.1, intake=600_000)
    ...     rates.record("fast2", 65536, 0.12, intake=500_000)
    ...     rates.record("slow", 65536, 2.0, intake=50_000)
    ...     rates.record("behind", 65536, 0.1, intake=40_000)  # sends fast, gets slowly
    >>> [p for p in ("fast1", "fast2", "slow", "behind", "new") if rates.slow(p)]
    ['slow', 'behind']
"""

from __future__ import annotations

import collections
import statistics
import threading
import time

# A peer is slow below these fractions of the median peer's rate and intake. The
# emulator's slow nodes have a tenth of the others' link (issue 20's fault): as their
# children timed them, 4-23x below the median peer; fast peers of a node at load 50 were
# timed up to 6x below it (a reader thread waiting for a CPU in mid-piece). An intake is
# a median already, steadier: slow nodes told 7-16x less than the others.
FACTOR = 8.0
INTAKE_FACTOR = 4.0
KNOWN_AFTER = 4  # pieces timed before a peer's rate counts
WINDOW = 16  # pieces remembered per peer
PEERS_KNOWN = 3  # peers with a known rate before any is called slow
# The shortest data phase counted: a piece that came in one burst (a token bucket's, a
# socket buffer already full when the reader got to it) is not infinitely fast.
MIN_SECONDS = 1e-3
# Seconds the medians are kept before they are worked out again (each piece timed
# works them out too): not once per question, which is once per piece asked.
RECOUNT = 1.0


class _Window:
    """One peer's last pieces, (when, bytes, seconds), with their sums kept as they come
    and go: its rate is O(1) a question, where summing the window each time was a node's
    largest cost per piece after the framing (two sums of up to ``WINDOW`` pieces, for
    every peer, each time a median was worked out: 12% of a node's CPU with 2,720 pieces)."""

    __slots__ = ("nbytes", "pieces", "seconds", "size")

    def __init__(self, size: int) -> None:
        self.pieces: collections.deque[tuple[float, int, float]] = collections.deque()
        self.nbytes = 0
        self.seconds = 0.0
        self.size = size

    def add(self, when: float, nbytes: int, seconds: float) -> None:
        self.pieces.append((when, nbytes, seconds))
        self.nbytes += nbytes
        self.seconds += seconds
        if len(self.pieces) > self.size:
            self._pop()

    def age(self, before: float) -> None:
        """Forget the pieces timed before ``before``."""
        while self.pieces and self.pieces[0][0] < before:
            self._pop()

    def _pop(self) -> None:
        _, nbytes, seconds = self.pieces.popleft()
        self.nbytes -= nbytes
        self.seconds -= seconds
        if not self.pieces:  # no float residue carried over an empty window
            self.nbytes, self.seconds = 0, 0.0


class LinkRates:
    def __init__(
        self,
        horizon: float,
        factor: float = FACTOR,
        intake_factor: float = INTAKE_FACTOR,
        known_after: int = KNOWN_AFTER,
        window: int = WINDOW,
    ) -> None:
        self.horizon = horizon
        self.factor = factor
        self.intake_factor = intake_factor
        self.known_after = known_after
        self.window = window
        # peer -> (when, bytes, seconds) of its last pieces, and their sums
        self._pieces: dict[str, _Window] = {}
        # peer -> (when, its intake) as it last told it
        self._intakes: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()
        self._rates_median: float | None = None
        self._intakes_median: float | None = None
        self._counted_at = -RECOUNT - 1.0

    def record(self, peer: str, nbytes: int, seconds: float, intake: int = 0) -> None:
        """A piece of ``nbytes`` from ``peer`` whose bytes took ``seconds`` to come, and
        the intake ``peer`` told with it (0: none told)."""
        now = time.monotonic()
        with self._lock:
            pieces = self._pieces.get(peer)
            if pieces is None:
                pieces = self._pieces[peer] = _Window(self.window)
            pieces.add(now, nbytes, max(MIN_SECONDS, seconds))
            if intake > 0:
                self._intakes[peer] = (now, intake)
            self._counted_at = -RECOUNT - 1.0

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

    def median(self) -> float | None:
        """This node's intake: the median of its peers' known rates (None: too few)."""
        with self._lock:
            self._count_locked(time.monotonic())
            return self._rates_median

    def slow(self, peer: str) -> bool:
        """Whether ``peer``'s pieces come at under 1/``factor`` of the median peer's rate,
        or its own at under 1/``intake_factor`` of the median intake told."""
        now = time.monotonic()
        with self._lock:
            mine = self._rate_locked(peer, now)
            if mine is None:
                return False
            self._count_locked(now)
            if self._rates_median is not None and mine * self.factor < self._rates_median:
                return True
            told = self._intake_locked(peer, now)
            median = self._intakes_median
            return told is not None and median is not None and told * self.intake_factor < median

    def _count_locked(self, now: float) -> None:
        if now - self._counted_at <= RECOUNT:
            return
        rates = [r for p in list(self._pieces) if (r := self._rate_locked(p, now)) is not None]
        self._rates_median = statistics.median(rates) if len(rates) >= PEERS_KNOWN else None
        told = [t for p in list(self._intakes) if (t := self._intake_locked(p, now)) is not None]
        self._intakes_median = statistics.median(told) if len(told) >= PEERS_KNOWN else None
        self._counted_at = now

    def _rate_locked(self, peer: str, now: float) -> float | None:
        pieces = self._pieces.get(peer)
        if pieces is None:
            return None
        pieces.age(now - self.horizon)
        if len(pieces.pieces) < self.known_after:
            return None
        return pieces.nbytes / pieces.seconds

    def _intake_locked(self, peer: str, now: float) -> int | None:
        got = self._intakes.get(peer)
        if got is None or now - got[0] > self.horizon:
            return None
        return got[1]
