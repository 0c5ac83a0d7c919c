"""Hedged requests: a piece is asked of the next source once the one asked is late, not
after it failed.

A piece has a few sources in order of preference (its owner among the job's nodes, the
store, the nodes that may hold it). :func:`first` asks the first; when it has not
answered within its ``late`` bound, or answers that it cannot, the next is asked as
well, and so on; the first answer wins. Sources still running finish in their threads
and their answers are dropped (one not yet started is cancelled): a late source is
never called dead for being late. Each source runs in its pool, so store reads that
hang (the store's own bound is 30 s) fill the store's pool and never hold up a peer::

    >>> from concurrent.futures import ThreadPoolExecutor
    >>> import threading
    >>> hung = threading.Event()
    >>> pool = ThreadPoolExecutor(4)
    >>> first([Source("store", lambda: hung.wait(5) and b"late", 0.05, pool),
    ...        Source("peer", lambda: b"piece", 1.0, pool)])
    (b'piece', 'peer')
    >>> hung.set()
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

# Store reads at once per node (queued beyond: a queued read is cancelled once another
# source answered), and asks of peers at once.
STORE_READS = cf.ThreadPoolExecutor(max_workers=32, thread_name_prefix="hedge-store")
PEER_ASKS = cf.ThreadPoolExecutor(max_workers=64, thread_name_prefix="hedge-peer")
# A source that needs a slot to be asked as a hedge and finds none looks again this often
# (it is asked at once, slot or not, when the ones before it cannot answer).
RECHECK = 0.25


@dataclass(frozen=True)
class Source(Generic[T]):
    name: str
    get: Callable[[], T | None]  # the piece; None: not here (the next is asked at once)
    late: float  # seconds after which the next source is asked as well
    pool: cf.Executor
    # Asked as a hedge (the sources before it still running, only late) only while a
    # slot is free, held until it answers: what bounds hedged reads of a shared store.
    slots: threading.Semaphore | None = None
    # Set by ``get`` while the source is getting the piece itself (a peer's heartbeats:
    # it reads the store for it); the next is then asked only after ``patient()``
    # seconds from the ask.
    getting: threading.Event | None = None
    patient: Callable[[], float] | None = None


class NoSource(LookupError):
    """No source had the piece, and none raised."""


def first(sources: Sequence[Source[T]]) -> tuple[T, str]:
    """The first answer of ``sources`` and its source's name. If none answers, the first
    error a source raised (a store's, say, rather than a peer's "not here"), else
    :class:`NoSource`."""
    running: dict[cf.Future[T | None], str] = {}
    errors: list[BaseException] = []
    i = 0
    next_at = 0.0
    # The source asked last, when, and its answer to come.
    last: tuple[Source[T], float, cf.Future[T | None]] | None = None
    try:
        while True:
            now = time.monotonic()
            if last is not None and last[2] in running and now >= next_at:
                src, asked, _ = last
                if src.getting is not None and src.patient is not None and src.getting.is_set():
                    # Getting the piece itself: the next would read it a second time.
                    next_at = max(next_at, asked + src.patient())
            if i < len(sources) and (not running or now >= next_at):
                src = sources[i]
                slots = src.slots if running else None  # asked as a hedge: needs a slot
                if slots is not None and not slots.acquire(blocking=False):
                    next_at = now + RECHECK  # every slot taken: wait, look again
                    continue
                i += 1
                fut = src.pool.submit(src.get)
                if slots is not None:  # free again once it answered, or was cancelled
                    fut.add_done_callback(functools.partial(_release, slots))
                running[fut] = src.name
                next_at = now + src.late
                last = (src, now, fut)
                continue
            if not running:
                break
            # (a source never late, ``inf``: the next waits for it to answer)
            wait = None if i >= len(sources) or math.isinf(next_at) else max(0.0, next_at - now)
            done, _ = cf.wait(running, wait, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                name = running.pop(fut)
                try:
                    got = fut.result()
                except Exception as exc:
                    errors.append(exc)
                    next_at = 0.0  # it cannot: the next now
                    continue
                if got is not None:
                    return got, name
                next_at = 0.0
    finally:
        for fut in running:
            fut.cancel()  # only one still queued: a running one finishes, unheard
    if errors:
        raise errors[0]
    raise NoSource("no source had the piece")


def _release(slots: threading.Semaphore, _: object) -> None:
    slots.release()
