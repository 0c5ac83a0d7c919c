"""A node-wide exclusive lock on a root-only lock file, waited for up to a deadline.

``flock`` on a file root creates (0600, never through a link): released when the
descriptor closes, so also when the holder dies. Waiting polls (a blocking ``flock``
cannot be given a deadline without a signal, which hooks must not spend).

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "x.lock"
>>> with held(p, wait=1.0):
...     try:
...         with held(p, wait=0.05):
...             pass
...     except TimeoutError as e:
...         print("busy")
busy
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def held(path: Path, wait: float, poll: float = 0.01) -> Iterator[None]:
    """Hold ``path``'s lock; TimeoutError when another holds it for more than ``wait`` s."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{path} held by another for more than {wait:g}s") from None
                time.sleep(poll)
        yield
    finally:
        os.close(fd)  # releases the lock
