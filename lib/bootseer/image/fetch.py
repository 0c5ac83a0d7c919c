"""Fetching blocks: once per block however many readers wait, checked, cached, bounded.

Every wanted block becomes one job, keyed by digest, in a priority queue served by a
fixed pool of threads (``prefetch_parallel``): a reader's miss (``DEMAND``) before the
hot set (``PREFETCH``) before the cold rest (``BACKGROUND``). Background jobs take at
most ``background_parallel`` threads, at the lowest CPU priority, and wait while any
other fetch runs, for ``quiet`` seconds after one ends and for ``read_quiet`` seconds
after any job read the image, so the fill never competes with a starting job for the
link or the CPU. A block whose digest does
not match is refused and fetched again; a reader waits at most ``timeout`` seconds
and then gets :class:`FetchError` (EIO through FUSE), whatever the store does.

A source that can (:class:`RunSource`: a job's peers) is asked for several blocks in one
request, a *run* (:meth:`Fetcher.request_run`): one job in the queue, one thread, one
request for up to ``prefetch_run_kib`` of blocks, the hot set's (``PREFETCH``) and the
fill's (``BACKGROUND``: held back, capped and paced as its single blocks are). A block of
a queued run that a reader misses is taken out of it and fetched alone, at once; so is a
block of a fill's run in flight (the peer may be holding it back behind its own start):
the reader does not wait for the run. A block the run did not bring (the peer had it
not, or sent bad bytes) is queued again on its own, within its time::

    >>> f = Fetcher(cache, workers=16, background_workers=2, timeout=30)  # doctest: +SKIP
    >>> data = f.get(StoreSource(store), manifest, 7)  # doctest: +SKIP
    ... # (blocks until local or FetchError)
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import functools
import heapq
import itertools
import math
import os
import stat
import threading
import time
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from bootseer import digest as digests
from bootseer.errors import BootseerError, describe
from bootseer.image.blocks import block_key
from bootseer.image.cache import BlockCache
from bootseer.image.manifest import Manifest
from bootseer.store import Store

DEMAND, PREFETCH, BACKGROUND = 0, 1, 2


class FetchError(BootseerError):
    """A block could not be fetched (store unreachable, missing or damaged) in time."""


class BlockSource(Protocol):
    def read_block(
        self, index: int, block_digest: str, offset: int, length: int, priority: int
    ) -> bytes: ...

    def describe(self) -> str: ...


# A block of a run: its index in the image, its digest, its length.
RunBlock = tuple[int, str, int]

# A fetched block's bytes: a run's blocks are read-only views of the buffer the run
# came in (not copied out of it; the buffer is used again once no view is left).
Block = bytes | memoryview
# A block a run brought, checked: its bytes, and its chunk CRCs (the cache's,
# image.cache.checked_crcs, taken as it was checked; None: the cache takes them).
RunPart = tuple[Block, "array[int] | None"]


class RunSource(BlockSource, Protocol):
    """A source that serves runs of blocks (:class:`bootseer.p2p.imagesource.PeerSource`)."""

    def run_peer(self, block_digest: str) -> str | None:
        """Whom a run holding this block is asked of; None: ask for it alone."""
        ...

    def read_run(
        self, peer: str, blocks: Sequence[RunBlock], priority: int
    ) -> list[RunPart | None]:
        """The run's blocks from ``peer``, in order, each checked against its digest
        (None: not got, or did not match: the fetcher asks for it alone). Never raises."""
        ...


def run_source(source: BlockSource) -> RunSource | None:
    """``source`` if it serves runs, else None."""
    if callable(getattr(source, "run_peer", None)) and callable(getattr(source, "read_run", None)):
        return source  # type: ignore[return-value]
    return None


class StoreSource:
    """Blocks in the store, by digest (images added with ``bootseer image add``)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def read_block(
        self, index: int, block_digest: str, offset: int, length: int, priority: int
    ) -> bytes:
        return self.store.read_bytes(block_key(block_digest))

    def describe(self) -> str:
        return self.store.uri


class FileSource:
    """Blocks read from the image file itself (a path image on a shared filesystem).

    Through one descriptor, opened once and checked (a regular file the job's user may
    read: :func:`bootseer.image.registry.open_image_file`), never by the path again: a
    user who swaps the file for a FIFO, or a directory on its path for a link, after the
    check changes nothing the agent reads. Without ``fd`` the path is opened here, once
    (non-blocking, no link as the last component, regular files only). ``close`` waits
    for no one: a read still under way finishes, and later reads fail.
    """

    def __init__(self, path: str, fd: int | None = None) -> None:
        self.path = path
        if fd is None:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise FetchError(f"{path} is not a regular file")
            except BaseException:
                os.close(fd)
                raise
        self._fd: int | None = fd
        self.stat = os.fstat(fd)
        self._lock = threading.Lock()
        self._readers = 0

    @property
    def identity(self) -> tuple[int, int, int, int]:
        """What the file was when opened: device, inode, size, mtime (ns)."""
        st = self.stat
        return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns

    def read_block(
        self, index: int, block_digest: str, offset: int, length: int, priority: int
    ) -> bytes:
        with self._lock:
            fd = self._fd
            if fd is None:
                raise FetchError(f"{self.path}: the image file was closed")
            self._readers += 1
        try:
            return os.pread(fd, length, offset)
        finally:
            with self._lock:
                self._readers -= 1
                if self._fd is None and self._readers == 0:
                    os.close(fd)

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
            if fd is not None and self._readers == 0:
                os.close(fd)

    def describe(self) -> str:
        dev, ino, _, _ = self.identity
        return f"{self.path} (dev {dev} inode {ino})"


def _follow(future: cf.Future[Block], done: cf.Future[Block]) -> None:
    """Settle ``future`` as ``done`` was (a fill's block after the reader's own fetch)."""
    if future.done():
        return
    if done.cancelled():
        future.cancel()
    elif (exc := done.exception()) is not None:
        future.set_exception(exc)
    else:
        future.set_result(done.result())


def nice_thread(value: int) -> None:
    """Set this thread's CPU priority (Linux: per thread); background work runs at 19."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), value)


class Interest:
    """Who asked for a background fetch; once cancelled, its queued fetches are dropped."""

    cancelled = False


@dataclass(eq=False)
class _Job:
    digest: str
    index: int
    offset: int
    length: int
    source: BlockSource
    image_id: str
    priority: int
    created: float
    future: cf.Future[Block] = field(default_factory=cf.Future)
    taken: bool = False
    interests: list[Interest] = field(default_factory=list)
    order: int = 0  # its place in the queue among its priority's (the run's, if in one)
    wanted: int = BACKGROUND  # the most urgent priority asked for it (a reader's, mid-run)
    in_fill_run: bool = False  # taken in a background run in flight: a reader asks alone


@dataclass(eq=False)
class _Run:
    """Blocks asked of one peer in one request: each still its own job (and future)."""

    peer: str
    source: RunSource
    image_id: str
    priority: int
    jobs: list[_Job]
    order: int


@dataclass
class FetchStats:
    blocks: int = 0
    bytes: int = 0
    corrupt: int = 0
    errors: int = 0
    by_image: Counter[str] = field(default_factory=Counter)
    by_priority: Counter[int] = field(default_factory=Counter)  # DEMAND, PREFETCH, BACKGROUND
    runs: int = 0  # runs asked (each one request for several blocks)
    run_blocks: int = 0  # blocks a run brought


# Added to a job's place to put it before every job of its priority not ahead (a block
# a peer asked for that this node had not queued: the peer waits on it now, while this
# node's own hot set, queued before, is the next seconds' work).
AHEAD = -(1 << 62)

# A time.monotonic() before any other: "never". 0.0 is not: the clock counts from the
# machine's boot, so a node up for less than read_quiet would find a job reading at once.
NEVER = -math.inf


class Fetcher:
    def __init__(
        self,
        cache: BlockCache,
        workers: int = 16,
        background_workers: int = 2,
        timeout: float = 30.0,
        log: Callable[[str], None] = lambda _: None,
        quiet: float = 0.2,
        read_quiet: float = 1.0,
        background_bps: float = 0.0,
    ) -> None:
        self.cache = cache
        self.timeout = timeout
        self.background_workers = max(1, min(background_workers, workers))
        self.quiet = quiet
        self.fail_ttl = min(2.0, timeout)
        self._failed: dict[str, float] = {}  # digest -> when a reader last gave up on it
        self.read_quiet = read_quiet
        self.background_bps = background_bps  # 0: no cap
        self._bg_next = 0.0  # when the pacer lets the next background byte go
        self.log = log
        self.stats = FetchStats()
        self._cond = threading.Condition()
        # (priority, order, seq, job or run): a block requeued from a run keeps its place.
        self._heap: list[tuple[int, int, int, _Job | _Run]] = []
        self._seq = itertools.count()
        self._jobs: dict[str, _Job] = {}
        self._running_fg = 0
        self._running_bg = 0
        self._last_fg = NEVER  # when a foreground fetch last ended
        self.last_read = NEVER  # a job's last read through FUSE, hit or miss (set by the agent)
        self._stopped = False
        self._halt = threading.Event()  # set by stop(): ends the pacer's waits
        self._threads = [
            threading.Thread(target=self._work, name=f"fetch-{i}", daemon=True)
            for i in range(max(1, workers))
        ]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._halt.set()
            self._cond.notify_all()

    def request(
        self,
        source: BlockSource,
        manifest: Manifest,
        index: int,
        priority: int,
        interest: Interest | None = None,
        ahead: bool = False,
    ) -> cf.Future[Block]:
        """A future for block ``index``; joins the fetch already under way, if any.
        ``ahead``: a block not yet queued goes before every other of its priority (a
        peer waits on it now: :func:`bootseer.p2p.imagesource.provide_run`)."""
        d = manifest.blocks[index]
        with self._cond:
            job = self._jobs.get(d)
            if job is None or (job.in_fill_run and priority < BACKGROUND):
                # (A fill's run in flight may wait on its peer's quiet: the reader's own
                # fetch of the block goes beside it, and the run's job follows this one.)
                job = _Job(
                    d,
                    index,
                    index * manifest.block_size,
                    manifest.block_length(index),
                    source,
                    manifest.id,
                    priority,
                    time.monotonic(),
                    order=self._order(ahead, priority),
                )
                self._jobs[d] = job
                self._push(job)
            elif priority < job.priority and not job.taken:
                job.priority = priority  # the older, lower entry is skipped when it surfaces
                job.created = time.monotonic()  # its time limit runs from this request
                job.order = next(self._seq)  # (out of its run, if it was in one)
                self._push(job)
            job.wanted = min(job.wanted, priority)
            if interest is not None:
                job.interests.append(interest)
            if priority < BACKGROUND or len(self._heap) == 1:
                # Waking idle workers for every background block only makes them spin;
                # once the queue holds work they look again every ``quiet`` seconds.
                self._cond.notify()
        return job.future

    def request_run(
        self,
        source: RunSource,
        peer: str,
        manifest: Manifest,
        indices: Sequence[int],
        priority: int,
        interest: Interest | None = None,
        ahead: bool = False,
    ) -> list[cf.Future[Block]]:
        """Futures for blocks ``indices``, asked of ``peer`` as one run; a block already
        asked for joins its fetch instead. At ``BACKGROUND`` the run waits, as a single
        block does, for the node's start to be quiet, and is dropped once every block's
        interests are cancelled. ``ahead``: as :meth:`request`'s."""
        futures = []
        with self._cond:
            order = self._order(ahead, priority)
            members = []
            for i in indices:
                d = manifest.blocks[i]
                job = self._jobs.get(d)
                if job is None:
                    job = _Job(
                        d,
                        i,
                        i * manifest.block_size,
                        manifest.block_length(i),
                        source,
                        manifest.id,
                        priority,
                        time.monotonic(),
                        order=order,
                        wanted=priority,
                    )
                    self._jobs[d] = job
                    members.append(job)
                elif priority < job.priority and not job.taken:
                    job.priority, job.created, job.order = priority, time.monotonic(), order
                    self._push(job)
                job.wanted = min(job.wanted, priority)
                if interest is not None:
                    job.interests.append(interest)
                futures.append(job.future)
            if len(members) == 1:
                self._push(members[0])
            elif members:
                run = _Run(peer, source, manifest.id, priority, members, order)
                heapq.heappush(self._heap, (priority, order, next(self._seq), run))
            self._cond.notify()
        return futures

    def _order(self, ahead: bool, priority: int) -> int:
        """A new job's place among its priority's (under ``_cond``): after every one
        queued, or (``ahead``) before every one not ahead, in the order they came. The
        background fill never goes ahead: it waits for the node's start to be quiet."""
        return next(self._seq) + (AHEAD if ahead and priority < BACKGROUND else 0)

    def _push(self, job: _Job) -> None:
        heapq.heappush(self._heap, (job.priority, job.order, next(self._seq), job))

    def get(self, source: BlockSource, manifest: Manifest, index: int) -> Block:
        """Block ``index``, from the cache or fetched now; FetchError after ``timeout``.
        For a job's read (:class:`~bootseer.image.reader.ImageReader`): a cached block's
        pages leave the page cache again, the job's file keeping the bytes."""
        d = manifest.blocks[index]
        cached = self.cache.read(d, 0, manifest.block_length(index), drop=True)
        if cached is not None:
            return cached
        failed_at = self._failed.get(d)
        if failed_at is not None and time.monotonic() - failed_at < self.fail_ttl:
            # The kernel retries a failed read-ahead page by page: answer those at once
            # rather than make each wait the full timeout again.
            raise FetchError(f"block {index} of image {manifest.id[:12]}: failed moments ago")
        fut = self.request(source, manifest, index, DEMAND)
        try:
            data = fut.result(timeout=self.timeout)
        except cf.TimeoutError:
            self._failed[d] = time.monotonic()
            raise FetchError(
                f"block {index} of image {manifest.id[:12]}: no answer from "
                f"{source.describe()} within {self.timeout:g}s"
            ) from None
        except FetchError:
            self._failed[d] = time.monotonic()
            raise
        except cf.CancelledError:
            raise FetchError(f"block {index}: fetch cancelled") from None
        self._failed.pop(d, None)
        return data

    def _pick(self) -> _Job | _Run | None:
        while self._heap:
            prio, _, _, job = self._heap[0]
            if isinstance(job, _Run):
                # Its blocks not taken out meanwhile (a reader's miss, fetched alone), nor
                # (the fill's) wanted by no one any more.
                job.jobs = [
                    j
                    for j in job.jobs
                    if not j.taken
                    and not j.future.done()
                    and j.priority == job.priority
                    and not (prio == BACKGROUND and self._forsaken(j))
                ]
                if not job.jobs:
                    heapq.heappop(self._heap)
                    continue
                if prio == BACKGROUND and self._background_waits():
                    return None
                heapq.heappop(self._heap)
                return job if len(job.jobs) > 1 else job.jobs[0]
            if job.taken or job.future.done() or prio != job.priority:
                heapq.heappop(self._heap)
                continue
            if prio == BACKGROUND:
                if self._forsaken(job):
                    heapq.heappop(self._heap)
                    continue
                if self._background_waits():
                    return None
            heapq.heappop(self._heap)
            return job
        return None

    def wait_quiet(self) -> None:
        """Return once the node's start is quiet by the fill's rule (no fetch for a job
        under way or just ended, no job read just now), or the fetcher stopped: for other
        background work that must leave a starting job the link and the CPU
        (:mod:`bootseer.image.bundles`' writes)."""
        with self._cond:
            while not self._stopped:
                if not self._starting():
                    return
                self._cond.wait(self.quiet)

    def _forsaken(self, job: _Job) -> bool:
        """Whether every background asker of ``job`` has cancelled: then it is dropped
        (under ``_cond``)."""
        if not (job.interests and all(i.cancelled for i in job.interests)):
            return False
        if self._jobs.get(job.digest) is job:
            del self._jobs[job.digest]
        job.future.cancel()
        return True

    def _background_waits(self) -> bool:
        """Whether background work must wait (under ``_cond``): its threads are busy, or
        a job is busy starting (leave it the link and the CPU)."""
        return self._running_bg >= self.background_workers or self._starting()

    def _starting(self) -> bool:
        """Whether a job on the node is busy starting (under ``_cond``): a fetch for it
        under way or just ended, or a read of its image just now."""
        if self._running_fg:
            return True
        now = time.monotonic()
        return now - self._last_fg < self.quiet or now - self.last_read < self.read_quiet

    def _work(self) -> None:
        while True:
            with self._cond:
                item = self._pick()
                while item is None:
                    if self._stopped:
                        return
                    self._cond.wait(timeout=self.quiet if self._heap else None)
                    item = self._pick()
                jobs = item.jobs if isinstance(item, _Run) else [item]
                background = item.priority == BACKGROUND
                for job in jobs:
                    job.taken = True
                    job.in_fill_run = background and isinstance(item, _Run)
                if background:
                    self._running_bg += 1
                else:
                    self._running_fg += 1
            if background:
                nice_thread(19)
            try:
                if isinstance(item, _Run):
                    try:
                        self._fetch_run(item)
                    except Exception as exc:  # a bug: the run's waiters hear it, not a hang
                        for job in item.jobs:
                            if not job.future.done():
                                job.future.set_exception(FetchError(describe(exc)))
                else:
                    self._fetch_one(item)
            finally:
                with self._cond:
                    if background:
                        self._running_bg -= 1
                        nice_thread(0)
                    else:
                        self._running_fg -= 1
                        self._last_fg = time.monotonic()
                    for job in jobs:
                        job.in_fill_run = False
                        if job.future.done() and self._jobs.get(job.digest) is job:
                            del self._jobs[job.digest]
                    self._cond.notify_all()
            # Not held while this thread waits for the next: a done job's future holds
            # its block (a run's: a view of the buffer it came in, which is used again
            # only once no view of it is left).
            del item, jobs, job

    def _fetch_one(self, job: _Job) -> None:
        try:
            job.future.set_result(self._fetch(job))
        except Exception as exc:
            with self._cond:
                self.stats.errors += 1
            job.future.set_exception(
                exc
                if isinstance(exc, FetchError)
                else FetchError(f"block {job.index} of image {job.image_id[:12]}: {describe(exc)}")
            )

    def _fetch_run(self, run: _Run) -> None:
        """The run's blocks from its peer in one request, each checked by the source
        against its digest (RunSource.read_run); the ones it did not bring are queued
        again, each alone, in the run's place."""
        blocks = [(j.index, j.digest, j.length) for j in run.jobs]
        if run.priority == BACKGROUND:
            self._pace(sum(j.length for j in run.jobs))
        try:
            parts = run.source.read_run(run.peer, blocks, run.priority)
            if len(parts) != len(blocks):
                raise ValueError(f"{len(parts)} answers")
        except Exception as exc:  # the contract says never; a bug costs the run, not a block
            self.log(f"run of {len(blocks)} blocks from {run.peer}: {describe(exc)}")
            parts = [None] * len(blocks)
        again = []
        got: list[tuple[_Job, Block, array[int] | None]] = []
        for job, part in zip(run.jobs, parts, strict=True):
            job.in_fill_run = False  # the run has answered: a reader joins it from here
            if part is None:
                again.append(job)
            else:
                got.append((job, part[0], part[1]))
        # The run's blocks in one write, from the buffer they were received into.
        self.cache.put_many([(job.digest, data, crcs) for job, data, crcs in got])
        with self._cond:
            for job, data, _ in got:
                self._count(job, len(data))
            self.stats.run_blocks += len(got)
        for job, data, _ in got:
            # Not copied: a view of the run's buffer, read-only (the buffer is used
            # again only once no view of it is left: directio.Buffers).
            job.future.set_result(data if isinstance(data, bytes) else data.toreadonly())
        with self._cond:
            self.stats.runs += 1
            for job in again:
                alone = self._jobs.get(job.digest)
                if alone is not job and alone is not None:
                    # A reader's fetch of it went beside the run (in_fill_run): follow it.
                    alone.future.add_done_callback(functools.partial(_follow, job.future))
                    continue
                job.taken = False
                job.priority = min(job.priority, job.wanted)  # a reader waits on it now
                self._push(job)
            if again:
                self._cond.notify_all()

    def _count(self, job: _Job, nbytes: int) -> None:
        """A block fetched and cached, in the stats (under ``_cond``)."""
        self.stats.blocks += 1
        self.stats.bytes += nbytes
        self.stats.by_image[job.image_id] += nbytes
        self.stats.by_priority[job.priority] += nbytes

    def _pace(self, nbytes: int) -> None:
        """Hold a background fetch so the fill stays under ``background_bps`` on average."""
        if self.background_bps <= 0:
            return
        with self._cond:
            now = time.monotonic()
            start = max(now, self._bg_next)
            self._bg_next = start + nbytes / self.background_bps
        if start > now and self._halt.wait(start - now):
            raise FetchError("the fetcher stopped")

    def _fetch(self, job: _Job) -> bytes:
        deadline = job.created + self.timeout
        attempt = 0
        while True:
            cached = self.cache.read(job.digest, 0, job.length)
            if cached is not None:
                return cached
            if self._halt.is_set():
                raise FetchError(
                    f"block {job.index} of image {job.image_id[:12]}: the fetcher stopped"
                )
            try:
                if job.priority == BACKGROUND:
                    self._pace(job.length)
                data = job.source.read_block(
                    job.index, job.digest, job.offset, job.length, job.priority
                )
                # A source that verified the bytes itself (PeerSource) says so: hash once.
                matches = getattr(job.source, "matches", None)
                if matches(data, job.digest) if matches else digests.matches(data, job.digest):
                    self.cache.put(job.digest, data)
                    with self._cond:
                        self._count(job, len(data))
                    return data
                with self._cond:
                    self.stats.corrupt += 1
                problem = f"digest mismatch ({len(data)} bytes): refused"
                self.log(
                    f"block {job.index} ({job.digest[:12]}) from {job.source.describe()}: "
                    f"{problem}, fetching again"
                )
            except FileNotFoundError:
                problem = "missing from the store"
            except Exception as exc:
                problem = describe(exc)
            attempt += 1
            pause = min(2.0, 0.05 * 2**attempt)
            if time.monotonic() + pause > deadline:
                raise FetchError(
                    f"block {job.index} of image {job.image_id[:12]} from "
                    f"{job.source.describe()}: {problem} (gave up after "
                    f"{attempt} tries)"
                )
            time.sleep(pause)
