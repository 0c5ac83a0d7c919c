"""When a source of pieces is late: a few times its usual answer time, never less than a floor.

A piece asked of a peer or the store is *late* once it has taken ``factor`` times the
median of that source's recent answers (``floor`` at least, so a fast source's ordinary
jitter hedges nothing); the fetch then asks the next source as well
(:mod:`bootseer.p2p.hedge`). Late is not dead: the source is still waited for, and
nobody is dropped for being late::

    >>> late = Lateness(floor=0.5, factor=4.0, initial=2.0, known_after=3)
    >>> late.bound()  # nothing known yet: a job's first pieces wait longer
    2.0
    >>> for s in (0.2, 0.25, 0.3):
    ...     late.record(s)
    >>> late.bound()
    1.0
"""

from __future__ import annotations

import collections
import statistics
import threading

# Seconds: no piece is late sooner. At 2 s a straggler still set its job's pace (a window
# of 16 demand reads waited 2 s for each of its blocks: 8.2 s a task against 3.5 s at
# 0.5 s, tests/p2p/test_straggler_slurm.py); a fast peer's median is milliseconds.
FLOOR = 0.5
FACTOR = 4.0
WINDOW = 64  # answers remembered
# Until this many answers are known, a piece is late after INITIAL: a job's first pieces
# (owners still reading the store for them, a loaded node's first answers) are not
# hedged on a guess, which would read them from the store twice.
KNOWN_AFTER = 8
INITIAL = 2.0


class Lateness:
    def __init__(
        self,
        floor: float = FLOOR,
        factor: float = FACTOR,
        window: int = WINDOW,
        initial: float = INITIAL,
        known_after: int = KNOWN_AFTER,
    ) -> None:
        self.floor = floor
        self.factor = factor
        self.initial = initial
        self.known_after = known_after
        self._times: collections.deque[float] = collections.deque(maxlen=window)
        self._lock = threading.Lock()

    def record(self, seconds: float) -> None:
        """An answer (a piece, verified) that took ``seconds``."""
        with self._lock:
            self._times.append(seconds)

    def known(self) -> bool:
        """Whether enough answers are known for :meth:`bound` to be more than a guess."""
        with self._lock:
            return len(self._times) >= self.known_after

    def bound(self) -> float:
        """Seconds after which a piece asked now is late."""
        with self._lock:
            if len(self._times) < self.known_after:
                return max(self.floor, self.initial)
            return max(self.floor, self.factor * statistics.median(self._times))
