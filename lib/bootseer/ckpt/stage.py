"""Node-local staging for the parts of a checkpoint file written out of order.

A striped file streams to its targets front to back (:mod:`bootseer.ckpt.writer`), so a
400 GB checkpoint never needs 400 GB of local disk. What cannot stream is kept here
until it can: bytes written ahead of the stream (a gap, ``ftruncate`` then writes in any
order) wait until the stream reaches them, and bytes rewritten behind it (a zip
header patched after its data) wait for the commit, which re-uploads the units they
touch. A mount daemon has one :class:`Stage` (``[ckpt] stage_dir``, bounded by
``[ckpt] stage_bytes`` for all the daemons of the node together, through the node's
:class:`~bootseer.ckpt.ledger.StageLedger`); each writer gets a :class:`StageFile`: an
unlinked sparse file indexed by file offset, so a crash leaves nothing behind.

    >>> import tempfile
    >>> stage = Stage(Path(tempfile.mkdtemp()), limit=100)
    >>> f = stage.file("ada/run:model.pt")
    >>> f.put(10, b"abc"); f.extents.spans(0, 20)
    [(10, 13)]
    >>> f.get(10, 3), stage.used
    (b'abc', 3)
    >>> f.close(); stage.used
    0
"""

from __future__ import annotations

import bisect
import ctypes
import errno
import os
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from bootseer.ckpt.errors import CkptError, LedgerFull, StageFullError
from bootseer.ckpt.ledger import StageLedger

FALLOC_FL_KEEP_SIZE = 0x01  # linux/falloc.h
FALLOC_FL_PUNCH_HOLE = 0x02
_libc = ctypes.CDLL(None, use_errno=True)


def punch_hole(fd: int, offset: int, length: int) -> bool:
    """Give ``[offset, offset + length)`` of ``fd`` back to the filesystem (os has no
    fallocate with modes); False where the filesystem cannot."""
    rc = _libc.fallocate(
        fd,
        FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
        ctypes.c_int64(offset),
        ctypes.c_int64(length),
    )
    return bool(rc == 0)


class Extents:
    """Disjoint half-open byte ranges ``[start, end)``, kept sorted.

    >>> e = Extents(); e.add(0, 4); e.add(8, 10); e.add(3, 9); list(e)
    [(0, 10)]
    >>> e.remove(2, 5); list(e), e.total
    ([(0, 2), (5, 10)], 7)
    """

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(list(zip(self._starts, self._ends, strict=True)))

    def __bool__(self) -> bool:
        return bool(self._starts)

    @property
    def total(self) -> int:
        return sum(e - s for s, e in zip(self._starts, self._ends, strict=True))

    def spans(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of ``[start, end)`` that are covered, in order."""
        i = bisect.bisect_right(self._ends, start)
        out = []
        while i < len(self._starts) and self._starts[i] < end:
            out.append((max(start, self._starts[i]), min(end, self._ends[i])))
            i += 1
        return out

    def covered(self, start: int, end: int) -> int:
        return sum(e - s for s, e in self.spans(start, end))

    def first_at_or_after(self, pos: int) -> tuple[int, int] | None:
        i = bisect.bisect_right(self._ends, pos)
        return (self._starts[i], self._ends[i]) if i < len(self._starts) else None

    def add(self, start: int, end: int) -> None:
        if start >= end:
            return
        i = bisect.bisect_left(self._ends, start)  # first range that ends at or after start
        j = bisect.bisect_right(self._starts, end)  # ranges before j start at or before end
        if i < j:
            start = min(start, self._starts[i])
            end = max(end, self._ends[j - 1])
        self._starts[i:j] = [start]
        self._ends[i:j] = [end]

    def remove(self, start: int, end: int) -> None:
        if start >= end:
            return
        i = bisect.bisect_right(self._ends, start)
        j = bisect.bisect_left(self._starts, end)
        keep_s: list[int] = []
        keep_e: list[int] = []
        if i < j:
            if self._starts[i] < start:
                keep_s.append(self._starts[i])
                keep_e.append(start)
            if self._ends[j - 1] > end:
                keep_s.append(end)
                keep_e.append(self._ends[j - 1])
        self._starts[i:j] = keep_s
        self._ends[i:j] = keep_e


LEDGER = ".ledger"  # the node's ledger, beside the staged files


class Stage:
    """A daemon's staging area: a root-only directory and a byte bound for all its
    writers, and with a ``ledger`` for all the daemons of the node."""

    def __init__(self, directory: Path, limit: int, ledger: StageLedger | None = None) -> None:
        self.directory = directory
        self.limit = limit
        self.used = 0  # this daemon's
        self.staged = 0  # bytes put here in all (metrics: bootseer_ckpt_staged_bytes_total)
        self.ledger = ledger
        self._lock = threading.Lock()

    @classmethod
    def root_only(cls, directory: Path, limit: int) -> Stage:
        """The stage in ``directory``, made if missing, which must be root's and not
        writable by others (it holds users' checkpoint bytes); :class:`CkptError` if not."""
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = os.lstat(directory)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise CkptError(
                f"staging directory {directory} must be a directory of root's, mode 0700 "
                "([ckpt] stage_dir)"
            )
        return cls(directory, limit, StageLedger(directory / LEDGER, limit))

    def close(self) -> None:
        """Leave the node's ledger (at the daemon's exit; a killed daemon's record is
        dropped by the next reservation)."""
        if self.ledger is not None:
            self.ledger.close()

    def file(self, name: str) -> StageFile:
        """A new staging file for the writer of ``name`` (named in errors only)."""
        return StageFile(self, name)

    def _reserve(self, n: int, name: str) -> None:
        with self._lock:
            try:
                if self.ledger is not None:
                    self.ledger.reserve(n, name)
                elif self.used + n > self.limit:
                    raise LedgerFull(self.used, self.limit)
            except LedgerFull as full:
                raise StageFullError(
                    f"{name}: writing out of order needs {n} more bytes of node-local staging, "
                    f"and {full.used} of [ckpt] stage_bytes = {self.limit} are in use on this "
                    "node, by all its jobs' mounts (docs/ckpt.md, 'Write patterns'): write the "
                    "file front to back, or ask the site for a larger stage_bytes"
                ) from None
            self.used += n
            self.staged += n

    def _release(self, n: int) -> None:
        with self._lock:
            self.used -= n
            if self.ledger is not None:
                self.ledger.release(n)


class StageFile:
    """Staged bytes of one file being written, at their own offsets in a sparse file."""

    def __init__(self, stage: Stage, name: str) -> None:
        self.stage = stage
        self.name = name
        self.extents = Extents()
        self._fd: int | None = None

    def _open(self) -> int:
        if self._fd is None:
            self.stage.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            # Unlinked from the start: a crash (of the daemon, of the node) leaves nothing.
            try:
                self._fd = os.open(
                    self.stage.directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600
                )
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                    raise
                fd, name = tempfile.mkstemp(dir=self.stage.directory, prefix=".stage-")
                os.unlink(name)
                self._fd = fd
        return self._fd

    @property
    def staged(self) -> int:
        return self.extents.total

    def put(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        end = offset + len(data)
        new = (end - offset) - self.extents.covered(offset, end)
        self.stage._reserve(new, self.name)
        try:
            fd = self._open()
            view = memoryview(data)
            done = 0
            while done < len(view):
                done += os.pwrite(fd, view[done:], offset + done)
        except OSError as exc:
            self.stage._release(new)
            if exc.errno == errno.ENOSPC:
                raise StageFullError(
                    f"{self.name}: the staging directory {self.stage.directory} is full"
                ) from None
            raise
        self.extents.add(offset, end)

    def get(self, offset: int, n: int) -> bytes:
        """Staged bytes at ``[offset, offset + n)`` (zeros where nothing is staged)."""
        if self._fd is None:
            return bytes(n)
        data = os.pread(self._fd, n, offset)
        return data + bytes(n - len(data))

    def drop(self, start: int, end: int) -> None:
        """Forget ``[start, end)``: its bytes were used or overwritten."""
        spans = self.extents.spans(start, end)
        if not spans:
            return
        self.extents.remove(start, end)
        self.stage._release(sum(e - s for s, e in spans))
        if self._fd is not None:
            for s, e in spans:
                if not punch_hole(self._fd, s, e - s):
                    break  # a filesystem without hole punching: the bound still holds

    def close(self) -> None:
        self.stage._release(self.extents.total)
        self.extents = Extents()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
