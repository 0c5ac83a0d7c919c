"""A bounded pool of threads, started as work first needs them and kept for the next.

The agent's servers answer many short requests (a piece, a unit, a ping): a thread
started per request cost its creation and end each time (620 threads came and went in
one 2-node job, issue 19), and a pool sized for the worst case would start threads
nobody uses. :class:`Pool` starts a thread only when an item finds none free, never
more than ``size``, and keeps each for the next items::

    >>> done = []
    >>> pool = Pool(4, done.append, "doc")
    >>> for i in range(3):
    ...     pool.submit(i)
    >>> pool.stop(wait=True)
    >>> sorted(done), pool.started <= 3
    ([0, 1, 2], True)

Past ``size`` items under way, the next wait in submission order for a thread.
"""

from __future__ import annotations

import queue
import threading
import traceback
from collections.abc import Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")


class Pool(Generic[Item]):
    """At most ``size`` threads running ``work`` on submitted items; ``work`` handles its
    own errors (one escaping it is printed to stderr, and the thread goes on)."""

    def __init__(self, size: int, work: Callable[[Item], None], name: str) -> None:
        self.size = size
        self.work = work
        self.name = name
        self.started = 0  # threads started so far (each kept)
        self._free = 0  # threads waiting for an item, none promised to one yet
        self._queued = 0  # items waiting for a thread (all were busy, at ``size``)
        self._items: queue.SimpleQueue[Item | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def submit(self, item: Item) -> None:
        with self._lock:
            if self._free:
                self._free -= 1
                start = False
            elif self.started < self.size:
                self.started += 1
                start = True
            else:
                self._queued += 1
                start = False
            if start:
                t = threading.Thread(
                    target=self._run, name=f"{self.name}-{self.started}", daemon=True
                )
                self._threads.append(t)
        self._items.put(item)
        if start:
            t.start()

    def _run(self) -> None:
        while True:
            item = self._items.get()
            if item is None:
                return
            try:
                self.work(item)
            except Exception:  # ``work``'s own to handle: reported, the thread kept
                traceback.print_exc()
            finally:
                with self._lock:
                    if self._queued:
                        self._queued -= 1  # this thread takes one of those waiting
                    else:
                        self._free += 1

    def stop(self, wait: bool = False) -> None:
        """End the threads once the items submitted before are done."""
        with self._lock:
            threads = list(self._threads)
        for _ in threads:
            self._items.put(None)
        if wait:
            for t in threads:
                t.join()
