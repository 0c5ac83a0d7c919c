"""The restore's own member writer: what tarfile's ``extract`` did, in fewer system calls.

tarfile still parses the headers (ustar, pax); this writes what they describe into
the fresh temporary directory of :func:`bootseer.deps.archive.extract_snapshot`,
after :class:`~bootseer.deps.archive.SnapshotFilter` passed the member:

- a regular file is created ``O_CREAT|O_EXCL|O_NOFOLLOW`` with its filtered mode,
  its bytes go in with ``os.write`` from the stream, its mtime with ``futimens``: one
  open, the writes, one ``utime`` and one close (tarfile: an ``lstat`` per parent, two
  ``realpath`` walks in the data filter, open, writes, ``chmod``, ``utime``, close);
- a directory is made with the process's umask (the data filter keeps no directory
  mode) and gets its mtime once everything below it is written;
- a symlink is made with its text, a hard link to the file of the archive it names.

No name is ever written twice (``EEXIST`` is a refusal, not a replacement): together
with the filter's rules (no ``..``, no absolute name, nothing below a symlink of the
archive, hard links only to regular files before them) nothing can leave the
directory, and nothing is ever written through a link. Ownership is the extracting
process's (the job user's): nothing is chowned.

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> w = MemberWriter(d)
    >>> w.directory("a", 0); w.finish()
    >>> os.path.isdir(os.path.join(d, "a"))
    True
"""

from __future__ import annotations

import os
from collections.abc import Callable

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
CHUNK = 1 << 20


class WriteError(Exception):
    """A member could not be written (its name exists already, the stream ended...)."""


class MemberWriter:
    """Writes checked members into ``dest`` (a directory only this extraction writes)."""

    def __init__(self, dest: str) -> None:
        self.dest = dest
        umask = os.umask(0)
        os.umask(umask)
        self.umask = umask
        self._dirs: list[tuple[str, int]] = []

    def _path(self, name: str) -> str:
        return os.path.join(self.dest, name)

    def file(
        self,
        name: str,
        size: int,
        mode: int,
        mtime: int,
        read: Callable[[int], bytes | memoryview],
    ) -> None:
        """Create ``name`` and fill it with ``size`` bytes of ``read(n)``."""
        try:
            fd = os.open(self._path(name), _CREATE, mode)
        except FileExistsError:
            raise WriteError(f"{name!r} appears twice in the archive") from None
        try:
            left = size
            while left:
                data = read(min(left, CHUNK))
                if not data:
                    raise WriteError(f"the archive ends inside {name!r}")
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                left -= len(data)
            if mode & self.umask:
                os.fchmod(fd, mode)
            os.utime(fd, (mtime, mtime))
        finally:
            os.close(fd)

    def directory(self, name: str, mtime: int) -> None:
        try:
            os.mkdir(self._path(name))
        except FileExistsError:
            raise WriteError(f"{name!r} appears twice in the archive") from None
        self._dirs.append((name, mtime))

    def symlink(self, name: str, target: str) -> None:
        try:
            os.symlink(target, self._path(name))
        except FileExistsError:
            raise WriteError(f"{name!r} appears twice in the archive") from None

    def hardlink(self, name: str, target: str) -> None:
        try:
            os.link(self._path(target), self._path(name), follow_symlinks=False)
        except FileExistsError:
            raise WriteError(f"{name!r} appears twice in the archive") from None

    def finish(self) -> None:
        """Give directories their mtimes, deepest first (their contents are all there)."""
        for name, mtime in reversed(self._dirs):
            os.utime(self._path(name), (mtime, mtime), follow_symlinks=False)
