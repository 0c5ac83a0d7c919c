"""What a node remembers about its restores: one lock and one stamp per prefix.

Both live in root's node cache directory (``paths.cache_dir``/deps), never in a
user's tree. Jobs restoring into the same prefix on one node take the prefix's lock
in turn; the stamp tells the later ones that the prefix already holds their
snapshot (same key, same owner, and the very directory the restore created, by
device and inode), so a node restores each snapshot once.

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> with prefix_lock(Path(d), "/tmp/venv", timeout=1):
    ...     read_stamp(Path(d), "/tmp/venv") is None
    True
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bootseer import filelock, localrecord
from bootseer.errors import StepError
from bootseer.nodepaths import deps_cache


@dataclass(frozen=True)
class Stamp:
    prefix: str
    key: str
    uid: int
    dev: int
    ino: int
    time: float

    def matches(self, prefix: str, uid: int) -> bool:
        """True if ``prefix`` is still the directory this stamp's restore created."""
        try:
            st = os.lstat(prefix)
        except OSError:
            return False
        return (st.st_dev, st.st_ino, st.st_uid) == (self.dev, self.ino, uid) and self.uid == uid


def _name(prefix: str) -> str:
    return hashlib.sha256(prefix.encode()).hexdigest()[:32]


def _dir(cache_dir: Path, sub: str) -> Path:
    d = deps_cache(cache_dir) / sub
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


@contextlib.contextmanager
def prefix_lock(cache_dir: Path, prefix: str, timeout: float) -> Iterator[None]:
    """Hold the node-wide lock of ``prefix`` (waiting at most ``timeout`` seconds)."""
    path = _dir(cache_dir, "locks") / f"{_name(prefix)}.lock"
    try:
        with filelock.held(path, timeout, poll=0.05):
            yield
    except TimeoutError:
        raise StepError(
            f"another job on this node held the restore lock of {prefix} "
            f"for more than {timeout:.0f}s"
        ) from None


def read_stamp(cache_dir: Path, prefix: str) -> Stamp | None:
    try:
        return localrecord.read(Stamp, _dir(cache_dir, "stamps") / f"{_name(prefix)}.json")
    except (OSError, localrecord.RecordError):
        return None


def write_stamp(cache_dir: Path, stamp: Stamp) -> None:
    localrecord.write(_dir(cache_dir, "stamps") / f"{_name(stamp.prefix)}.json", stamp)
