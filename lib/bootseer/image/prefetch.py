"""Prefetch: the hot set first, in trace order, then the rest in the background.

:func:`prefetch_hot` queues the trace's blocks in first-access order at ``PREFETCH``
priority (the fetcher's thread pool bounds the parallel reads) and waits until all
are local or the deadline passes. The blocks a node gets from one peer (the job's
other nodes own most of them: :mod:`bootseer.p2p.imagesource`) are asked in runs
(:func:`request_blocks`): consecutive in trace order among that peer's, up to
``prefetch_run_kib`` each, one request per run, each block still checked by its own
digest. Trace order, not the image's: it is the order the job reads them in, so a run
is what the job needs next from that peer, and the store keeps each block as its own
object (by digest), so adjacency in the image buys no larger store read.
:class:`BackgroundFill` then queues every other block at ``BACKGROUND`` priority,
which yields to any read a job makes; a peer's blocks in runs too, consecutive in the
image's order among that peer's (the fill has no trace to follow), after the blocks
this node reads from the store itself (each peer reads its own share meanwhile)::

    >>> hot = prefetch_hot(fetcher, source, manifest, trace.blocks, deadline)  # doctest: +SKIP
    >>> fill = BackgroundFill(manifest.id)  # doctest: +SKIP
    >>> fill.start(fetcher, source, manifest, set(trace.blocks), run_bytes)  # doctest: +SKIP
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bootseer.image.blocks import MAX_RUN_BLOCKS
from bootseer.image.fetch import (
    BACKGROUND,
    PREFETCH,
    Block,
    BlockSource,
    Fetcher,
    Interest,
    run_source,
)
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
    # Hot blocks still on their way (kept up to date after the prolog's return: the rest
    # of the hot set streams on). A job's checkpoint warm-up waits for 0
    # (bootseer.ckpt.warm): the container's start needs these first.
    pending: int = 0

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
    run_bytes: int = 0,
) -> PrefetchResult:
    """Fetch ``order``'s blocks (trace order); return when all are local or at ``deadline``.

    With ``start_fraction`` below 1, return once that leading part of the trace is
    local: the rest keeps streaming at prefetch priority, ahead of the job's reads.
    ``run_bytes``: the largest run asked of a peer (0: block by block).
    """
    t0 = time.monotonic()
    res = PrefetchResult(hot_blocks=len(order))
    wanted = []
    for i in order:
        res.hot_bytes += manifest.block_length(i)
        if manifest.blocks[i] in fetcher.cache:
            res.local_before += 1
        else:
            wanted.append(i)
    first = set(order[: math.ceil(len(order) * max(0.0, start_fraction))])
    # The futures are not kept: a done one holds its block's bytes (a run's: a view of
    # the buffer it came in), which would stay in memory until the whole hot set is here.
    tally, total = _watch(
        request_blocks(fetcher, source, manifest, wanted, PREFETCH, run_bytes),
        lambda i: start_fraction >= 1.0 or i in first,
        manifest,
        res,
    )
    tally.wait(deadline)
    with tally.lock:
        res.failed = tally.failed
        res.fetched_blocks = tally.fetched
        res.fetched_bytes = tally.fetched_bytes
        res.complete = tally.done == total and not tally.failed
    res.seconds = time.monotonic() - t0
    return res


def _watch(
    futures: dict[cf.Future[Block], int],
    lead: Callable[[int], bool],
    manifest: Manifest,
    res: PrefetchResult,
) -> tuple[_Tally, int]:
    """A tally of ``futures`` as they end (``lead``: the blocks waited for), and their
    number; ``res.pending`` counts down as they do."""
    res.pending = len(futures)
    tally = _Tally(sum(1 for i in futures.values() if lead(i)), res)
    for f, i in futures.items():
        f.add_done_callback(functools.partial(tally.one, lead(i), manifest.block_length(i)))
    return tally, len(futures)


class _Tally:
    """The hot set's blocks as they end: how many, how many failed, and when the ones
    waited for are all in."""

    def __init__(self, leading: int, res: PrefetchResult) -> None:
        self.lock = threading.Condition()
        self.leading = leading  # blocks waited for still to end
        self.done = self.failed = self.fetched = self.fetched_bytes = 0
        self.res = res

    def one(self, lead: bool, length: int, fut: cf.Future[Block]) -> None:
        with self.lock:
            self.done += 1
            self.res.pending -= 1
            if fut.cancelled() or fut.exception() is not None:
                self.failed += 1
            else:
                self.fetched += 1
                self.fetched_bytes += length
            if lead:
                self.leading -= 1
                if self.leading == 0:
                    self.lock.notify_all()

    def wait(self, deadline: float) -> None:
        with self.lock:
            while self.leading > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self.lock.wait(left)


# A run holds blocks from at most this many runs' worth of ``indices`` (blocks a run may
# hold, times this): a peer that gives few of them (in a job's trees, a node's nearest
# parent gives 1/N of its blocks) gets shorter runs, not runs that wait for blocks far
# ahead of the readers. Unbounded, a run of 32 of a 1/16 parent's blocks spanned 512
# blocks of the trace; 16 such in flight kept a node's own store reads waiting behind
# them, and 16 emulated nodes took 105 s against the store link's 85 s (64: 14 runs past
# the asker's bound, 245 store reads more); bounded, 84.5 s (docs/p2p.md).
RUN_SPAN = 2


def request_blocks(
    fetcher: Fetcher,
    source: BlockSource,
    manifest: Manifest,
    indices: Sequence[int],
    priority: int,
    run_bytes: int,
    interest: Interest | None = None,
    ahead: bool = False,
) -> dict[cf.Future[Block], int]:
    """Futures for blocks ``indices`` (each block's index): those a peer gives (the
    source says whom: :class:`bootseer.image.fetch.RunSource`) asked of it in runs of up
    to ``run_bytes``, consecutive among that peer's in ``indices``' order, within
    ``RUN_SPAN`` runs' worth of ``indices``, and queued at their first block's place; the
    rest (the store's, this node's own) alone.
    ``interest``: who asked (the fill, which may cancel); ``ahead``: blocks not yet
    queued go before this node's own (:meth:`Fetcher.request`: a peer waits on them)."""
    runs = run_source(source) if run_bytes > 0 else None
    units: list[int | tuple[str, list[int]]] = []  # a block alone, or (peer, a run)
    # peer -> (its open run, [bytes], where in ``indices`` it started)
    filling: dict[str, tuple[list[int], list[int], int]] = {}
    span = RUN_SPAN * max(1, run_bytes // manifest.block_size)
    for k, i in enumerate(indices):
        peer = runs.run_peer(manifest.blocks[i]) if runs is not None else None
        if peer is None:
            units.append(i)
            continue
        length = manifest.block_length(i)
        run = filling.get(peer)
        if (
            run is None
            or run[1][0] + length > run_bytes
            or len(run[0]) >= MAX_RUN_BLOCKS
            or k - run[2] >= span
        ):
            run = filling[peer] = ([], [0], k)
            units.append((peer, run[0]))
        run[0].append(i)
        run[1][0] += length
    futures: dict[cf.Future[Block], int] = {}
    for unit in units:
        if isinstance(unit, int):
            futures[fetcher.request(source, manifest, unit, priority, interest, ahead)] = unit
        else:
            assert runs is not None
            peer, blocks = unit
            got = fetcher.request_run(runs, peer, manifest, blocks, priority, interest, ahead)
            futures.update(zip(got, blocks, strict=True))
    return futures


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
        self,
        fetcher: Fetcher,
        source: BlockSource,
        manifest: Manifest,
        skip: set[int],
        run_bytes: int = 0,
    ) -> None:
        """Queue every block not in ``skip`` nor local, in the image's order; with runs
        (``run_bytes``, the largest asked of a peer; 0: block by block), the blocks this
        node reads itself (the store's) first, then the peers' in runs: by then each
        peer has read its own share, and sends a run from its cache rather than holding
        it until the store gave it every block (a fill thread waiting all that time)."""
        wanted, seen = [], set()
        for i in range(manifest.nblocks):
            d = manifest.blocks[i]
            if i not in skip and d not in seen and d not in fetcher.cache:
                seen.add(d)  # a block the image holds twice (zeros) is fetched once
                wanted.append(i)
        runs = run_source(source) if run_bytes > 0 else None
        if runs is not None:
            peers = {i for i in wanted if runs.run_peer(manifest.blocks[i]) is not None}
            wanted = [i for i in wanted if i not in peers] + [i for i in wanted if i in peers]
        self.total = len(wanted)
        if not wanted:
            self.ended = time.time()
            return
        futures = request_blocks(fetcher, source, manifest, wanted, BACKGROUND, run_bytes, self)
        for fut, i in futures.items():
            fut.add_done_callback(functools.partial(self._one, manifest.block_length(i)))

    def _one(self, length: int, fut: cf.Future[Block]) -> None:
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
