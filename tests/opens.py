"""Counting the opens of files (inotify): how often a file store's object was read.

A file:// store reads an object by opening its file, so the opens of a manifest's file
while a job runs are the store reads of it, whichever node's namespace they came from::

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "m.json"; _ = p.write_text("{}")
    >>> with OpenCounter([p]) as opens:
    ...     _ = p.read_text()
    ...     opens.counts()[p]
    1
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

IN_OPEN = 0x20
IN_NONBLOCK = os.O_NONBLOCK
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_EVENT = struct.Struct("iIII")


class OpenCounter:
    def __init__(self, paths: Iterable[Path]) -> None:
        self.fd = _libc.inotify_init1(IN_NONBLOCK)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self._by_wd: dict[int, Path] = {}
        self._counts: dict[Path, int] = {}
        for p in paths:
            wd = _libc.inotify_add_watch(self.fd, os.fsencode(p), IN_OPEN)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {p}")
            self._by_wd[wd] = p
            self._counts[p] = 0

    def counts(self) -> dict[Path, int]:
        """The opens of each path so far."""
        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return dict(self._counts)
            i = 0
            while i < len(buf):
                wd, mask, _, length = _EVENT.unpack_from(buf, i)
                i += _EVENT.size + length
                if mask & IN_OPEN and wd in self._by_wd:
                    self._counts[self._by_wd[wd]] += 1

    def __enter__(self) -> OpenCounter:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        os.close(self.fd)
