"""The node's staging ledger: ``[ckpt] stage_bytes`` bounds all mounts of a node together.

Each checkpoint mount has its own daemon, and every daemon of a node stages into the same
directory (``[ckpt] stage_dir``). Bounded per daemon, N jobs on a node could stage N times
the bound. The ledger is a directory beside the staged files, root's: each daemon keeps
its staged bytes in a record file of its own, which it holds locked (``flock``) as long
as it lives; a reservation, under the ledger's lock, adds up the records of the daemons
alive and refuses what would pass the bound. A record whose lock is free belongs to a
daemon that died (its staged files, unlinked from the start, died with it): it is
removed and not counted, so a crash frees its share at the next reservation.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> a, b = StageLedger(d, limit=100), StageLedger(d, limit=100)
    >>> a.reserve(60, "ada/run:a.pt")
    >>> b.reserve(50, "bob/run:b.pt")
    Traceback (most recent call last):
    ...
    bootseer.ckpt.errors.LedgerFull: 60 of 100 bytes staged on this node
    >>> a.release(60); b.reserve(50, "bob/run:b.pt"); b.used, a.used
    (50, 0)
    >>> a.close(); b.close()
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import stat
import threading
from pathlib import Path

from bootseer.ckpt.errors import CkptError, LedgerFull
from bootseer.filelock import held

LOCK_NAME = ".lock"
RECORD_SUFFIX = ".staged"
LOCK_WAIT = 10.0  # seconds a reservation waits for another daemon's (a few file reads)


class StageLedger:
    """One daemon's entry in the node's ledger at ``directory`` (made root's 0700)."""

    def __init__(self, directory: Path, limit: int) -> None:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = os.lstat(directory)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise CkptError(f"staging ledger {directory} must be a directory of root's, mode 0700")
        self.directory = directory
        self.limit = limit
        self.used = 0  # this daemon's
        self._lock = threading.Lock()
        name = f"{os.getpid()}-{secrets.token_hex(4)}{RECORD_SUFFIX}"
        self._record = directory / name
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with self._held():  # no other daemon sees the record before it is locked
            self._fd: int | None = os.open(self._record, flags, 0o600)
            # Held while this daemon lives: others tell a live record from a dead one by it.
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            self._write(0)

    def reserve(self, n: int, name: str) -> None:
        """Take ``n`` more bytes for this daemon, or :class:`LedgerFull` (taking nothing)."""
        if n <= 0:
            return
        with self._lock, self._held():
            used = self._others() + self.used
            if used + n > self.limit:
                raise LedgerFull(used, self.limit)
            self.used += n
            self._write(self.used)

    def release(self, n: int) -> None:
        if n <= 0:
            return
        with self._lock, self._held():
            self.used = max(0, self.used - n)
            self._write(self.used)

    def node_used(self) -> int:
        """Bytes staged by all live daemons of the node, this one included."""
        with self._lock, self._held():
            return self._others() + self.used

    def close(self) -> None:
        with self._lock:
            if self._fd is None:
                return
            with contextlib.suppress(OSError):
                self._record.unlink()
            os.close(self._fd)
            self._fd = None
            self.used = 0

    def _held(self) -> contextlib.AbstractContextManager[None]:
        return held(self.directory / LOCK_NAME, wait=LOCK_WAIT)

    def _write(self, used: int) -> None:
        if self._fd is None:
            raise CkptError("staging ledger closed")
        data = b"%d\n" % used
        os.pwrite(self._fd, data.ljust(24), 0)

    def _others(self) -> int:
        """The other live daemons' staged bytes; dead daemons' records are removed."""
        total = 0
        for entry in os.scandir(self.directory):
            path = Path(entry.path)
            if not entry.name.endswith(RECORD_SUFFIX) or path == self._record:
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:  # its daemon lives
                    with contextlib.suppress(ValueError, IndexError):
                        total += int(os.pread(fd, 64, 0).split()[0])
                else:  # nobody holds it: its daemon died
                    with contextlib.suppress(OSError):
                        path.unlink()
            finally:
                os.close(fd)
        return total
