"""What hashing path images may cost the node agent (issue 21 item 7).

A path image is hashed by the agent (root) the first time a job names it: every byte
of a file a user chose. Bounded here three ways:

- holes: a file whose allocated blocks are less than :data:`MIN_ALLOCATED` of its
  size is refused before a byte is read (a sparse file costs its user next to nothing
  and the agent the hashing of all of it; a squashfs image is dense);
- at once: at most :data:`PER_USER` hashings for one user (by the job's uid) and
  :data:`PER_NODE` on the node; a job past either is answered "pending" and reads its
  image directly, as when another node registers it;
- in time: a hashing stops when the job that asked for it ends (its epilog's release,
  :meth:`HashBudget.cancel`), not only when the file ends.

    >>> budget = HashBudget()
    >>> with budget.slot(42, 1001, "/ada/i.sqsh") as progress:
    ...     budget.cancel(42)
    ...     progress(1 << 20, 0, 0)
    Traceback (most recent call last):
    ...
    bootseer.agentapi.errors.AgentPending: job 42 ended: hashing /ada/i.sqsh stopped after 1.0 MiB
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import Counter
from collections.abc import Iterator

from bootseer.agentapi.errors import AgentPending, AgentRefused
from bootseer.image.manifest import Progress
from bootseer.units import iec

PER_USER = 1  # path images one user's jobs have hashed at once on a node
PER_NODE = 2  # and all users' together (the agent's CPU and the file system's reads)
MIN_ALLOCATED = 0.5  # a file's allocated bytes against its size below which it is refused
DENSE_BELOW = 1 << 20  # files this small are hashed whatever their blocks


def check_dense(path: str, st: os.stat_result) -> None:
    """AgentRefused if ``st`` is mostly holes: it costs the targets and the agent its
    size, its owner only its blocks."""
    allocated = st.st_blocks * 512
    if st.st_size >= DENSE_BELOW and allocated < st.st_size * MIN_ALLOCATED:
        raise AgentRefused(
            f"image {path} is a sparse file ({iec(allocated)} allocated of its "
            f"{iec(st.st_size)}): an image file must be written out, not holes"
        )


class HashBudget:
    """The hashings under way, by job and uid; each can be cancelled by its job."""

    def __init__(self, per_user: int = PER_USER, per_node: int = PER_NODE) -> None:
        self.per_user = per_user
        self.per_node = per_node
        self._lock = threading.Lock()
        self._by_uid: Counter[int] = Counter()
        self._stop: dict[int, threading.Event] = {}

    @contextlib.contextmanager
    def slot(self, job_id: int, uid: int, path: str) -> Iterator[Progress]:
        """A progress callback for ``hash_file`` that stops it (AgentPending) once the
        job is cancelled; AgentPending at once if the user or the node is at its bound."""
        with self._lock:
            if self._by_uid[uid] >= self.per_user:
                raise AgentPending(
                    f"uid {uid} already has {self._by_uid[uid]} path image(s) hashed on this "
                    f"node (at most {self.per_user} at once): {path} is read directly"
                )
            if sum(self._by_uid.values()) >= self.per_node:
                raise AgentPending(
                    f"{self.per_node} path images are being hashed on this node: "
                    f"{path} is read directly"
                )
            self._by_uid[uid] += 1
            stop = self._stop[job_id] = threading.Event()

        def progress(done: int, total: int, uploaded: int) -> None:
            if stop.is_set():
                raise AgentPending(f"job {job_id} ended: hashing {path} stopped after {iec(done)}")

        try:
            yield progress
        finally:
            with self._lock:
                self._by_uid[uid] -= 1
                if self._by_uid[uid] <= 0:
                    del self._by_uid[uid]
                if self._stop.get(job_id) is stop:
                    del self._stop[job_id]

    def cancel(self, job_id: int) -> bool:
        """Stop the hashing ``job_id`` asked for, if one runs; True if it did."""
        with self._lock:
            stop = self._stop.get(job_id)
        if stop is None:
            return False
        stop.set()
        return True

    def running(self) -> int:
        with self._lock:
            return sum(self._by_uid.values())
