"""The node agent's log, bounded whatever its callers do (issue 21 item 5).

Anyone may make the agent log a line: a refused peer request on port 746 (any host,
no job needed), a checkpoint put with a long name on its socket (any local user). So
the agent's log is bounded three ways:

- a line is at most :data:`MAX_LINE` characters (a user's 1,000-character name is cut,
  and the line says how much was);
- lines of one kind (their first four words: ``p2p: refused peer 10.0.0.7:``,
  ``ckpt door: uid 1001``: one peer's or user's flood leaves others' lines alone)
  are logged :data:`BURST` times per :data:`WINDOW` seconds; the rest are counted,
  and one summary line says how many were left out, and the last of them;
- the file is rotated past :data:`MAX_BYTES` (``<node>-agent.log.1`` keeps the one
  before), so the agent's log holds at most about twice that on the node.

    >>> lines = []
    >>> log = AgentLog(lines.append, clock=lambda: 0.0)
    >>> for i in range(BURST + 5):
    ...     log(f"p2p: refused peer 10.0.0.7: bad proof for job {i}")
    >>> len(lines) == BURST
    True
    >>> log.flush(now=WINDOW + 1)
    >>> lines[-1]
    'log: 5 more lines like "p2p: refused peer 10.0.0.7: bad proof for job 24" in 61 s'
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

MAX_LINE = 2000  # characters of one line (a path or a name is rarely near it)
BURST = 20  # lines of one kind per window, logged as they come
WINDOW = 60.0  # seconds
MAX_KINDS = 256  # kinds tracked at once; past it, every new kind shares one budget
MAX_BYTES = 64 << 20  # the log file's size before it is rotated


@dataclass
class _Kind:
    since: float
    logged: int = 0
    dropped: int = 0
    last: str = ""


def kind_of(message: str) -> str:
    """What repeats in a flood: the message's first four words (who it is about)."""
    return " ".join(message.split(maxsplit=4)[:4])[:80]


def cut(message: str, limit: int = MAX_LINE) -> str:
    if len(message) <= limit:
        return message
    return f"{message[:limit]}... ({len(message) - limit} characters cut)"


class AgentLog:
    """``log(message)``: passed on to ``sink`` (a :class:`~bootseer.linelog.LineLog`)
    within the bounds above."""

    def __init__(
        self, sink: Callable[[str], None], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.sink = sink
        self.clock = clock
        self.dropped = 0  # lines left out since the agent started (metrics, tests)
        self._kinds: dict[str, _Kind] = {}
        self._lock = threading.Lock()

    def __call__(self, message: str) -> None:
        message = cut(message)
        now = self.clock()
        summaries = self._summaries(now)
        with self._lock:
            key = kind_of(message)
            if key not in self._kinds and len(self._kinds) >= MAX_KINDS:
                key = "(other)"
            k = self._kinds.setdefault(key, _Kind(now))
            if k.logged >= BURST:
                k.dropped += 1
                k.last = message
                self.dropped += 1
                message = ""
            else:
                k.logged += 1
        for line in summaries:
            self.sink(line)
        if message:
            self.sink(message)

    def flush(self, now: float | None = None) -> None:
        """Log the summaries of the windows that have ended (all of them at ``inf``)."""
        for line in self._summaries(self.clock() if now is None else now):
            self.sink(line)

    def _summaries(self, now: float) -> list[str]:
        out = []
        with self._lock:
            for key, k in list(self._kinds.items()):
                if now - k.since < WINDOW:
                    continue
                if k.dropped:
                    out.append(
                        f'log: {k.dropped} more lines like "{cut(k.last, 200)}" '
                        f"in {min(now - k.since, 1e9):.0f} s"
                    )
                del self._kinds[key]
        return out
