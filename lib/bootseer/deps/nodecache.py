"""What a node remembers about its restores: one lock and one stamp per prefix, and
when it last marked a snapshot used in the store.

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
import time
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


# A node marks a snapshot used in the store at most this often: the mark serves gc,
# whose ages are days, and each is a store write the prolog waits for.
MARK_EVERY = 3600.0


def marked_lately(cache_dir: Path, scope: str, key: str) -> bool:
    """True if this node marked snapshot ``scope/key`` used less than MARK_EVERY ago."""
    try:
        st = os.stat(_dir(cache_dir, "marks") / _name(f"{scope}/{key}"))
    except OSError:
        return False
    return 0 <= time.time() - st.st_mtime < MARK_EVERY


def note_marked(cache_dir: Path, scope: str, key: str) -> None:
    """Remember that the store took this node's mark of ``scope/key`` now; forget the
    marks too old to matter, so the directory holds about an hour's snapshots."""
    marks = _dir(cache_dir, "marks")
    path = marks / _name(f"{scope}/{key}")
    with contextlib.suppress(OSError):
        path.touch(mode=0o600)
        os.utime(path)
    now = time.time()
    with contextlib.suppress(OSError), os.scandir(marks) as it:
        for entry in it:
            with contextlib.suppress(OSError):
                if now - entry.stat(follow_symlinks=False).st_mtime > 2 * MARK_EVERY:
                    os.unlink(entry.path)
