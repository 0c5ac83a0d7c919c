"""Prefetch: the hot set first, in trace order, then the rest in the background.

:func:`prefetch_hot` queues the trace's blocks in first-access order at ``PREFETCH``
priority (the fetcher's thread pool bounds the parallel reads) and waits until all
are local or the deadline passes. :class:`BackgroundFill` then queues every other
block at ``BACKGROUND`` priority, which yields to any read a job makes::

    >>> hot = prefetch_hot(fetcher, source, manifest, trace.blocks, deadline)  # doctest: +SKIP
    >>> fill = BackgroundFill(manifest.id)  # doctest: +SKIP
    >>> fill.start(fetcher, source, manifest, set(trace.blocks))  # doctest: +SKIP
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bootseer.image.fetch import BACKGROUND, PREFETCH, BlockSource, Fetcher, Interest
from bootseer.image.manifest import Manifest

if TYPE_CHECKING:
    from bootseer.agentapi.jobs import FillState  # what the epilog hears of the fill


@dataclass
class PrefetchResult:
    hot_blocks: int = 0
    hot_bytes: int = 0
    local_before: int = 0  # already in the node's cache
    fetched_blocks: int = 0
    fetched_bytes: int = 0
    failed: int = 0
    complete: bool = True  # every hot block local before the deadline
    seconds: float = 0.0

    @property
    def hit_ratio(self) -> float:
        return self.local_before / self.hot_blocks if self.hot_blocks else 1.0


def prefetch_hot(
    fetcher: Fetcher,
    source: BlockSource,
    manifest: Manifest,
    order: Sequence[int],
    deadline: float,
    start_fraction: float = 1.0,
) -> PrefetchResult:
    """Fetch ``order``'s blocks (trace order); return when all are local or at ``deadline``.

    With ``start_fraction`` below 1, return once that leading part of the trace is
    local: the rest keeps streaming at prefetch priority, ahead of the job's reads.
    """
    t0 = time.monotonic()
    res = PrefetchResult(hot_blocks=len(order))
    futures: dict[cf.Future[bytes], int] = {}
    for i in order:
        res.hot_bytes += manifest.block_length(i)
        if manifest.blocks[i] in fetcher.cache:
            res.local_before += 1
        else:
            futures[fetcher.request(source, manifest, i, PREFETCH)] = i
    leading = set(futures)
    if start_fraction < 1.0:
        k = math.ceil(len(order) * max(0.0, start_fraction))
        first = set(order[:k])
        leading = {f for f, i in futures.items() if i in first}
    cf.wait(leading, timeout=max(0.0, deadline - time.monotonic()))
    done = {f for f in futures if f.done()}
    pending = set(futures) - done
    for f in done:
        if f.cancelled() or f.exception() is not None:
            res.failed += 1
        else:
            res.fetched_blocks += 1
            res.fetched_bytes += manifest.block_length(futures[f])
    res.complete = not pending and not res.failed
    res.seconds = time.monotonic() - t0
    return res


class BackgroundFill(Interest):
    """The cold rest of one image, fetched behind the job's own reads."""

    def __init__(self, image_id: str) -> None:
        self.image_id = image_id
        self.started = time.time()
        self.ended: float | None = None
        self.total = 0
        self.done = 0
        self.fetched_bytes = 0
        self.failed = 0
        self._lock = threading.Lock()

    @property
    def state(self) -> FillState:
        if self.cancelled and (self.ended is None or self.failed):
            return "cancelled"
        return "done" if self.ended is not None else "running"

    def start(
        self, fetcher: Fetcher, source: BlockSource, manifest: Manifest, skip: set[int]
    ) -> None:
        wanted = [
            i
            for i in range(manifest.nblocks)
            if i not in skip and manifest.blocks[i] not in fetcher.cache
        ]
        self.total = len(wanted)
        if not wanted:
            self.ended = time.time()
            return
        for i in wanted:
            fut = fetcher.request(source, manifest, i, BACKGROUND, interest=self)
            fut.add_done_callback(functools.partial(self._one, manifest.block_length(i)))

    def _one(self, length: int, fut: cf.Future[bytes]) -> None:
        with self._lock:
            self.done += 1
            if fut.cancelled() or fut.exception() is not None:
                self.failed += 1
            else:
                self.fetched_bytes += length
            if self.done >= self.total and self.ended is None:
                self.ended = time.time()

    def cancel(self) -> None:
        self.cancelled = True
