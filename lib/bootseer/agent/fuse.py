"""The read-only FUSE filesystem of prepared images.

The mount holds one file per prepared job, ``<job_id>.sqsh``, owned by the job's
user and readable by no one else (``default_permissions`` makes the kernel check).
The mount is ``ro``: opening for write, chmod, truncate and create fail (EROFS).
Every read is served by a worker thread (``READ_THREADS`` at once), never on the event
loop: a read of the cache's disk (cold) or a miss that waits for the fetcher holds up
no other request, and the preads and CRC checks (which release the GIL) of several
requests run at once. A read the store cannot serve in time fails with EIO.
:func:`bootseer.agent.daemon.serve` mounts it.

    >>> pyfuse3.init(ImageFS(agent), "/run/bootseer/images", set(MOUNT_OPTIONS))  # doctest: +SKIP
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
import time
from typing import Any, cast

import pyfuse3
import trio

from bootseer.agent.assembly import Agent
from bootseer.agent.jobs import INODE_BASE, JobView
from bootseer.image.fetch import FetchError

READ_AHEAD_KIB = 8192
READ_THREADS = 8
ROOT = pyfuse3.ROOT_INODE
MOUNT_OPTIONS = {
    "fsname=bootseer",
    "subtype=bootseer",
    "ro",
    "allow_other",
    "default_permissions",
}


class ImageFS(pyfuse3.Operations):  # type: ignore[misc]
    def __init__(self, agent: Agent) -> None:
        super().__init__()
        self.agent = agent
        self._handles: dict[int, JobView] = {}
        self._next = itertools.count(1)
        self._started = time.time_ns()
        self._readers = trio.CapacityLimiter(READ_THREADS)

    def _root_attr(self) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = ROOT
        a.st_mode = stat.S_IFDIR | 0o755
        a.st_nlink = 2
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = self._started
        a.attr_timeout = a.entry_timeout = 1
        return a

    def _file_attr(self, view: JobView) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = view.inode
        a.st_mode = stat.S_IFREG | 0o400
        a.st_nlink = 1
        a.st_uid = view.uid
        a.st_gid = view.gid
        a.st_size = view.image.manifest.size
        a.st_blksize = view.image.manifest.block_size
        a.st_blocks = (a.st_size + 511) // 512
        t = int(view.prepared_at * 1e9)
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = t
        # The content never changes; a new job is a new inode, so caching is safe.
        a.attr_timeout = a.entry_timeout = 60
        return a

    def _view(self, inode: int) -> JobView:
        view = self.agent.jobs.by_inode(inode)
        if view is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return view

    async def getattr(self, inode: pyfuse3.InodeT, ctx: Any = None) -> pyfuse3.EntryAttributes:
        if inode == ROOT:
            return self._root_attr()
        for view in self._handles.values():  # a released job's file stays readable while open
            if view.inode == inode:
                return self._file_attr(view)
        return self._file_attr(self._view(inode))

    async def lookup(
        self, parent_inode: pyfuse3.InodeT, name: bytes, ctx: Any = None
    ) -> pyfuse3.EntryAttributes:
        if parent_inode != ROOT:
            raise pyfuse3.FUSEError(errno.ENOENT)
        stem = name.removesuffix(b".sqsh")
        if not stem.isdigit() or not name.endswith(b".sqsh"):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._file_attr(self._view(int(stem) + INODE_BASE))

    async def opendir(self, inode: pyfuse3.InodeT, ctx: Any) -> pyfuse3.FileHandleT:
        if inode != ROOT:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return 0

    async def readdir(self, fh: pyfuse3.FileHandleT, start_id: int, token: Any) -> None:
        views = self.agent.jobs.views()
        for i, view in enumerate(views):
            if i < start_id:
                continue
            if not pyfuse3.readdir_reply(token, view.name.encode(), self._file_attr(view), i + 1):
                break

    async def open(self, inode: pyfuse3.InodeT, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        if flags & os.O_ACCMODE != os.O_RDONLY or flags & (os.O_TRUNC | os.O_APPEND):
            raise pyfuse3.FUSEError(errno.EROFS)
        view = self._view(inode)
        fh = next(self._next)
        self._handles[fh] = view
        return pyfuse3.FileInfo(fh=fh, keep_cache=True)

    async def read(self, fh: pyfuse3.FileHandleT, off: int, size: int) -> bytes:
        view = self._handles.get(fh)
        if view is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        try:
            data = await trio.to_thread.run_sync(
                self.agent.reader.read,
                view,
                off,
                size,
                abandon_on_cancel=True,
                limiter=self._readers,
            )
        except FetchError as exc:
            self.agent.log(f"job={view.job_id} read at {off}: EIO: {exc}")
            raise pyfuse3.FUSEError(errno.EIO) from None
        assert data is not None
        # pyfuse3 replies with any contiguous buffer: the reader's own, no copy to bytes.
        return cast(bytes, data)

    async def release(self, fh: pyfuse3.FileHandleT) -> None:
        self._handles.pop(fh, None)

    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_blocks = sum(v.image.manifest.size for v in self.agent.jobs.views()) // 4096
        s.f_files = len(self.agent.jobs.ids()) + 1
        s.f_namemax = 255
        return s
