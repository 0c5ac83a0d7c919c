"""The FUSE filesystem that shows one striped namespace as a directory tree.

It runs as root (store credentials never reach the job's user) and is mounted with
``allow_other,default_permissions`` (:func:`mount_options`): every inode is reported as
the job user's, with mode 0700 for directories and 0600 for files, so the kernel lets
that user in and nobody else (root aside). The daemon process that mounts and serves it
is :mod:`bootseer.ckptd.daemon`.

Reads go through a :class:`StripedReader` per open file (read-ahead over all targets).
Writes stream into a :class:`StripedWriter`: bytes written front to back go straight to
the targets; what savers write out of order (``ftruncate`` then writes, a gap, a header
patched after its data) waits in node-local staging (:mod:`bootseer.ckpt.stage`, bounded
by ``[ckpt] stage_bytes``). A file becomes the new version when it is closed or
fsync'ed; the manifest goes last. When the writing process dies of a signal (a killed
job), its half-written file is dropped and the previous version stays. The daemon's
recent log lines are the read-only file ``.bootseer.log`` at the mount's root, for the
job's user (the log file itself is root's, :mod:`bootseer.ckptd.log`).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import itertools
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pyfuse3
import trio

from bootseer import sitekey
from bootseer.ckpt.errors import (
    CkptIOError,
    CkptLinkAbsolute,
    CkptLinkEscapes,
    CkptPathError,
    CkptQuotaExceeded,
    StageFullError,
)
from bootseer.ckpt.manifest import Manifest, Symlink
from bootseer.ckpt.names import check_path
from bootseer.ckpt.namespace import Namespace
from bootseer.ckpt.reader import StripedReader
from bootseer.ckpt.stage import Stage
from bootseer.ckpt.tree import Tree
from bootseer.ckpt.writer import StripedWriter
from bootseer.ckptd.counts import MountCounts, Refusal
from bootseer.ckptd.log import LOG_NAME, log
from bootseer.errors import BootseerError, StoreError, describe

# How long a rename, unlink or new write waits for the previous writer's release.
RELEASE_WAIT = 2.0

T = TypeVar("T")
TIMEOUT = 1.0  # seconds the kernel may cache names and attributes
PF_EXITING = 0x4  # include/linux/sched.h


def died_of_signal(pid: int) -> bool:
    """True when process ``pid`` is exiting because of a signal (read from /proc).

    The kernel closes a dying process's files after it set ``PF_EXITING`` and its exit
    code, so a close that FUSE sees from a killed writer can be told from a real one.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return False
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        flags, exit_code = int(fields[6]), int(fields[49])
    except (IndexError, ValueError):
        return False
    return bool(flags & PF_EXITING) and (exit_code & 0x7F) != 0


def _tgid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return pid


@dataclass
class _Handle:
    ino: int
    path: str
    reader: StripedReader | None = None
    writer: StripedWriter | None = None
    # The descriptors open on the writer (a second open of the file on this node joins
    # it): file handle -> thread group of the process that opened it. The last release
    # commits (or drops, when that process was killed).
    openers: dict[int, int] = field(default_factory=dict)
    failed: str = ""  # a write failed: the close reports it and commits nothing
    unlinked: bool = False  # its name was removed while open: nothing is committed
    orphan: Manifest | None = None  # ... and the version the name held, deleted at close
    errno: int = errno.EIO  # ... with this errno
    log: bool = False  # the daemon's log file (LOG_NAME)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _truncate_open(w: StripedWriter, size: int) -> bool:
    """Truncate a version still being written; False if it was closed (committed) first."""
    if w.closed:
        return False
    w.truncate(size)
    return True


class CkptFS(pyfuse3.Operations):
    def __init__(self, ns: Namespace, uid: int, gid: int, stage: Stage | None = None) -> None:
        super().__init__()
        self.ns = ns
        self.uid = uid
        self.gid = gid
        self.stage = stage
        self._paths: dict[int, str] = {pyfuse3.ROOT_INODE: ""}
        self._inodes: dict[str, int] = {"": pyfuse3.ROOT_INODE}
        self._next_ino = itertools.count(pyfuse3.ROOT_INODE + 1)
        self._next_fh = itertools.count(1)
        self._handles: dict[int, _Handle] = {}
        self._dirs: dict[int, list[tuple[str, str, Manifest | Symlink | StripedWriter | bool]]] = {}
        self._writing: dict[str, StripedWriter] = {}
        self._owner: dict[StripedWriter, _Handle] = {}  # until its release is done
        self._unlinked: dict[int, _Handle] = {}  # inode -> writer unlinked while open
        self._versions: dict[int, str] = {}  # inode -> version last opened, for keep_cache
        self._lock = threading.Lock()
        self.bytes_read = 0  # served to the job, for the epilog's phase record
        self.bytes_written = 0
        self.committed = 0  # new versions, and new versions dropped
        self.dropped = 0
        self.reads = 0
        # Calls refused by reason, and calls answered EIO: for the metrics.
        self.refused: collections.Counter[Refusal] = collections.Counter()
        self.io_errors = 0

    def counts(self) -> MountCounts:
        """What this mount has done so far (the metrics' samples, the totals at exit)."""
        return MountCounts(
            bytes_read=self.bytes_read,
            bytes_written=self.bytes_written,
            reads=self.reads,
            committed=self.committed,
            dropped=self.dropped,
            io_errors=self.io_errors,
            refused=dict(self.refused),
            store_bytes=self.ns.store_bytes,
            peer_bytes=self.ns.peer_bytes,
            corrupt_units=self.ns.corrupt_units,
            manifests_refused=sitekey.refused[sitekey.CKPT_MANIFEST],
            staged_bytes=self.stage.staged if self.stage is not None else 0,
        )

    def _refuse(self, reason: Refusal, err: int) -> pyfuse3.FUSEError:
        """The error for a call the mount refuses, counted by ``reason``."""
        self.refused[reason] += 1
        return pyfuse3.FUSEError(err)

    # -- helpers
    def _ino(self, path: str) -> int:
        with self._lock:
            ino = self._inodes.get(path)
            if ino is None:
                ino = next(self._next_ino)
                self._inodes[path] = ino
                self._paths[ino] = path
            return ino

    def _path(self, ino: int) -> str:
        try:
            return self._paths[ino]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    def _child(self, parent: int, name: bytes, creating: bool) -> str:
        base = self._path(parent)
        text = os.fsdecode(name)
        if len(name) > 255:
            raise pyfuse3.FUSEError(errno.ENAMETOOLONG)
        path = f"{base}/{text}" if base else text
        try:
            return check_path(path)
        except CkptPathError as exc:
            if creating:
                log(f"refused name {path!r}: {exc}")
                raise self._refuse("name", errno.EINVAL) from None
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking store work in a thread; turn errors into errnos (and log lines)."""
        try:
            return await trio.to_thread.run_sync(fn, *args)
        except pyfuse3.FUSEError:
            raise
        except StageFullError as exc:
            log(str(exc))
            raise self._refuse("stage_full", errno.ENOSPC) from None
        except CkptQuotaExceeded as exc:
            log(str(exc))
            raise self._refuse("quota", errno.EDQUOT) from None
        except CkptIOError as exc:
            log(str(exc))
            self.io_errors += 1
            raise pyfuse3.FUSEError(errno.EIO) from None
        except CkptLinkAbsolute as exc:
            log(str(exc))
            raise self._refuse("not_permitted", errno.EPERM) from None
        except CkptLinkEscapes as exc:
            log(str(exc))
            raise self._refuse("not_permitted", errno.EXDEV) from None
        except CkptPathError:
            raise pyfuse3.FUSEError(errno.EINVAL) from None
        except OSError as exc:
            if exc.errno is None or exc.errno == errno.EIO:
                log(f"I/O error: {describe(exc)}")
                self.io_errors += 1
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
        except (BootseerError, StoreError) as exc:
            log(f"error: {exc}")
            self.io_errors += 1
            raise pyfuse3.FUSEError(errno.EIO) from None
        except Exception as exc:
            # Escaping into pyfuse3 would end the daemon (the job's mount with it).
            log(f"internal error: {exc!r}")
            self.io_errors += 1
            raise pyfuse3.FUSEError(errno.EIO) from None

    def _kind(
        self, path: str, tree: Tree | None = None
    ) -> Manifest | Symlink | StripedWriter | bool | None:
        """A manifest or open writer (a file), True (a directory) or None (nothing);
        ``tree``: through this rename table (a listing's)."""
        if path == "":
            return True
        writer = self._writing.get(path)
        if writer is not None:
            return writer
        m = self.ns.node(path, tree)
        if m is not None:
            return m
        return True if self.ns.is_dir(path, tree) else None

    def _attrs(
        self, ino: int, kind: Manifest | Symlink | StripedWriter | bool, timeout: float = TIMEOUT
    ) -> pyfuse3.EntryAttributes:
        if isinstance(kind, StripedWriter) and kind.committed is None:
            # Not cached: a new version may still be dropped (EDQUOT, a killed writer),
            # and the kernel would then keep a file that is not there (ENOENT for the
            # next open of that name, even with O_CREAT).
            timeout = 0
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.entry_timeout = timeout
        a.attr_timeout = timeout
        a.st_uid = self.uid
        a.st_gid = self.gid
        a.st_blksize = 1 << 20
        if kind is True or kind is False:
            a.st_mode = stat.S_IFDIR | 0o700
            a.st_nlink = 2
            a.st_size = 0
            mtime = 0.0
        elif isinstance(kind, Symlink):
            a.st_mode = stat.S_IFLNK | 0o777
            a.st_nlink = 1
            a.st_size = kind.size
            mtime = kind.mtime
        else:
            a.st_mode = stat.S_IFREG | 0o600
            a.st_nlink = 1
            a.st_size = kind.size
            mtime = kind.mtime if isinstance(kind, Manifest) else time.time()
        a.st_blocks = -(-a.st_size // 512)
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = int(mtime * 1e9)
        return a

    def _log_attrs(self) -> pyfuse3.EntryAttributes:
        a = self._attrs(self._ino(LOG_NAME), True, timeout=0)
        a.st_mode = stat.S_IFREG | 0o400
        a.st_nlink = 1
        a.st_size = len(log.text())
        a.st_blocks = -(-a.st_size // 512)
        a.st_mtime_ns = a.st_ctime_ns = a.st_atime_ns = time.time_ns()
        return a

    async def _stat(self, path: str) -> pyfuse3.EntryAttributes:
        if path == LOG_NAME:
            return self._log_attrs()
        kind = await self._run(self._kind, path)
        if kind is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attrs(self._ino(path), kind)

    # -- names
    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        if name in (b".", b".."):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return await self._stat(self._child(parent_inode, name, creating=False))

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return await self._stat_ino(inode)

    async def _stat_ino(self, inode: int) -> pyfuse3.EntryAttributes:
        h = self._unlinked.get(inode)
        if h is not None and h.writer is not None:  # fstat of a file unlinked while open
            a = self._attrs(inode, h.writer)
            a.st_nlink = 0
            return a
        return await self._stat(self._path(inode))

    async def setattr(
        self,
        inode: int,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: int | None,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        path = self._path(inode)
        if path == LOG_NAME:
            raise self._refuse("not_permitted", errno.EPERM)
        if fields.update_size:
            handle = self._handles.get(fh) if fh is not None else None
            handle = handle or self._unlinked.get(inode)
            if handle is not None and handle.writer is None:
                raise pyfuse3.FUSEError(errno.EBADF)
            await self._run(self._set_size, path, handle, attr.st_size)
        # Owner and mode are the job user's by construction; chmod/utime are accepted
        # and have no effect, as on many network filesystems.
        return await self._stat_ino(inode)

    def _set_size(self, path: str, handle: _Handle | None, size: int) -> None:
        """truncate(2) and ftruncate(2): of the version being written, if there is one (to
        the final size before writing: safetensors, fio; or back to 0 to write again),
        else a new version of the committed file. A writer found closed is the latter: its
        last descriptor's release committed it while this request was on its way (a
        ``truncate -s`` right after a close; under load the release comes later)."""
        writer = handle.writer if handle else self._writing.get(path)
        if writer is not None:
            handle = handle or self._owner.get(writer)
            if handle is not None:
                if self._locked(handle, _truncate_open, writer, size):
                    return
            elif not writer.closed:
                raise pyfuse3.FUSEError(errno.EBUSY)
        if size == 0:
            self._truncate(path)
        else:
            self._resize(path, size)

    def _truncate(self, path: str) -> None:
        if self.ns.manifest(path) is None:
            raise FileNotFoundError(errno.ENOENT, path)
        self.ns.open(path, "wb").close()

    def _resize(self, path: str, size: int) -> None:
        """``truncate -s SIZE`` of a file nobody writes: a new version of that size (the
        bytes kept are copied into it)."""
        m = self.ns.manifest(path)
        if m is None:
            raise FileNotFoundError(errno.ENOENT, path)
        if m.size == size:
            return
        w = StripedWriter(self.ns, path, base=m, stage=self.stage)
        try:
            w.truncate(size)
        except BaseException:
            w.abort()
            raise
        w.close()
        self.committed += 1
        log(f"{path}: truncated to {size} bytes: committed version {w.version}")

    @staticmethod
    def _locked(h: _Handle, fn: Callable[..., T], *args: Any) -> T:
        """``fn`` under the handle's lock, and a failure poisons the handle's new version."""
        with h.lock:
            if h.failed:
                raise OSError(h.errno, h.failed)
            try:
                return fn(*args)
            except BaseException as exc:
                h.failed = describe(exc)  # never "": that would leave the handle unpoisoned
                h.errno = exc.errno if isinstance(exc, OSError) and exc.errno else errno.EIO
                raise

    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        path = self._child(parent_inode, name, creating=True)
        if await self._run(self._kind, path) is not None:
            raise pyfuse3.FUSEError(errno.EEXIST)
        await self._run(self.ns.mkdir, path)
        return self._attrs(self._ino(path), True)

    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        path = self._child(parent_inode, name, creating=False)
        kind = await self._run(self._kind, path)
        if kind is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if kind is not True:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        await self._run(self.ns.rmdir, path)

    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        path = self._child(parent_inode, name, creating=False)
        if path == LOG_NAME:
            raise self._refuse("not_permitted", errno.EPERM)
        w = self._writing.get(path)
        h = self._owner.get(w) if w is not None else None
        if h is not None and h.openers and await self._run(self._unlink_open, h, path):
            return
        if not await self._released(path):
            raise pyfuse3.FUSEError(errno.EBUSY)
        kind = await self._run(self._kind, path)
        if kind is True:
            raise pyfuse3.FUSEError(errno.EISDIR)
        await self._run(self.ns.remove, path)

    def _unlink_open(self, h: _Handle, path: str) -> bool:
        """unlink(2) of a file open for writing on this node, as on a local disk: the
        name goes at once (with a version an fsync published under it), the descriptors
        write on into a version nobody sees, dropped at the last close. tensorstore
        (Orbax) removes its ``<key>.__lock`` file so when it had nothing to write.
        False: the writer was closed or renamed meanwhile (an ordinary unlink then)."""
        with h.lock:
            if self._writing.get(path) is not h.writer or h.writer is None or h.writer.closed:
                return False
            if self.ns.node(path) is not None:
                # Its units stay until the last close: the writer reads and copies from
                # its fsync'ed or base version as long as it is open.
                m = self.ns.unname(path)
                h.orphan = m if isinstance(m, Manifest) else None
            h.unlinked = True
            with self._lock:  # before the name is free: made again, it gets a new inode
                if self._inodes.get(path) == h.ino:
                    del self._inodes[path]
                self._unlinked[h.ino] = h
            del self._writing[path]
        log(f"{path}: removed while open for writing; what is written on is dropped at close")
        return True

    async def _released(self, *paths: str) -> bool:
        """Whether no writer holds ``paths``, waiting up to RELEASE_WAIT for one that is
        closing: the kernel sends RELEASE after close() has returned, so `cp a b && mv b c`
        (or a rewrite at once) would otherwise meet EBUSY for a few milliseconds."""
        deadline = trio.current_time() + RELEASE_WAIT
        while any(p in self._writing for p in paths):
            if trio.current_time() >= deadline:
                return False
            await trio.sleep(0.005)
        return True

    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        src = self._child(parent_inode_old, name_old, creating=False)
        dst = self._child(parent_inode_new, name_new, creating=True)
        if LOG_NAME in (src, dst):
            raise self._refuse("not_permitted", errno.EPERM)
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise pyfuse3.FUSEError(errno.EINVAL)
        if src == dst:
            return
        if not await self._released(dst):
            raise pyfuse3.FUSEError(errno.EBUSY)
        writer = self._writing.get(src)
        if writer is not None:
            # Renamed while still open (safetensors' temporary file): the writer goes
            # on under the new name and publishes there when it is closed.
            dkind = await self._run(self._kind, dst)
            if dkind is True:
                raise pyfuse3.FUSEError(errno.EISDIR)
            if dkind is not None and flags & pyfuse3.RENAME_NOREPLACE:
                raise pyfuse3.FUSEError(errno.EEXIST)
            if await self._run(self._move_writer, writer, src, dst):
                self._renamed(src, dst)
                return
        kind = await self._run(self._kind, src)
        if kind is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if kind is True:
            await self._rename_dir(src, dst, flags)
            return
        dkind = await self._run(self._kind, dst)
        if dkind is True:
            raise pyfuse3.FUSEError(errno.EISDIR)
        if dkind is not None and flags & pyfuse3.RENAME_NOREPLACE:
            raise pyfuse3.FUSEError(errno.EEXIST)
        await self._run(self.ns.rename, src, dst)
        self._renamed(src, dst)

    async def _rename_dir(self, src: str, dst: str, flags: int) -> None:
        """One write of the namespace's rename table (:mod:`bootseer.ckpt.tree`): the
        whole directory or nothing, whatever it holds; readers keep what they opened."""
        deadline = trio.current_time() + RELEASE_WAIT
        while any(p == src or p.startswith(src + "/") for p in self._writing):
            if trio.current_time() >= deadline:
                log(f"rename of {src} to {dst} refused: a file below it is open for writing")
                raise pyfuse3.FUSEError(errno.EBUSY)
            await trio.sleep(0.005)
        replace = not flags & pyfuse3.RENAME_NOREPLACE
        await self._run(self.ns.rename_dir, src, dst, replace)
        log(f"directory {src} renamed to {dst}")
        with self._lock:
            for old, ino in list(self._inodes.items()):
                if old == dst or old.startswith(dst + "/"):
                    del self._inodes[old]
                    self._paths.pop(ino, None)
            for old, ino in list(self._inodes.items()):
                if old == src or old.startswith(src + "/"):
                    new = dst + old[len(src) :]
                    del self._inodes[old]
                    self._inodes[new] = ino
                    self._paths[ino] = new

    def _move_writer(self, w: StripedWriter, src: str, dst: str) -> bool:
        """Point an open writer of ``src`` at ``dst`` (False: it was closed meanwhile,
        so ``src`` is an ordinary file now)."""
        h = self._owner.get(w)
        if h is None:
            return False
        with h.lock:  # not while its close commits
            if w.closed or self._writing.get(src) is not w:
                return False
            if w.committed is not None:  # an fsync published it under the old name
                self.ns.rename(src, dst)
            w.rename(dst)
            self._writing[dst] = self._writing.pop(src)
            h.path = dst
        log(f"{src}: renamed to {dst} while open for writing")
        return True

    def _renamed(self, src: str, dst: str) -> None:
        with self._lock:
            ino = self._inodes.pop(src, None)
            old = self._inodes.pop(dst, None)
            if old is not None:
                self._paths.pop(old, None)
            if ino is not None:
                self._inodes[dst] = ino
                self._paths[ino] = dst

    # -- directories
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        path = self._path(inode)

        def listing() -> list[tuple[str, str, Manifest | Symlink | StripedWriter | bool]]:
            out = []
            # One rename table for the whole listing: another node renaming this
            # directory meanwhile must not cut it short (the table read again halfway).
            tree = self.ns.tree()
            for e in self.ns.listdir(path, tree):
                sub = f"{path}/{e.name}" if path else e.name
                # Readdirplus hands attributes to the kernel: a wrong size would cut the
                # page cache of a file being read, so each file's manifest is read.
                kind = True if e.is_dir else self._kind(sub, tree)
                if kind is not None:
                    out.append((e.name, sub, kind))
            return out

        entries = await self._run(listing)
        fh = next(self._next_fh)
        self._dirs[fh] = entries
        return fh

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        entries = self._dirs.get(fh, [])
        for i in range(start_id, len(entries)):
            name, sub, kind = entries[i]
            attrs = self._attrs(self._ino(sub), kind)
            if not pyfuse3.readdir_reply(token, os.fsencode(name), attrs, i + 1):
                break

    async def releasedir(self, fh: int) -> None:
        self._dirs.pop(fh, None)

    # -- files
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        path = self._path(inode)
        if path == LOG_NAME:
            if flags & os.O_ACCMODE != os.O_RDONLY:
                raise self._refuse("not_permitted", errno.EACCES)
            fh = next(self._next_fh)
            self._handles[fh] = _Handle(inode, path, log=True)
            return pyfuse3.FileInfo(fh=fh, direct_io=True)
        if flags & os.O_ACCMODE == os.O_RDONLY:
            reader = await self._run(self._open_read, path)
            fh = next(self._next_fh)
            self._handles[fh] = _Handle(inode, path, reader=reader)
            keep = self._versions.get(inode) == reader.manifest.version
            self._versions[inode] = reader.manifest.version
            return pyfuse3.FileInfo(fh=fh, keep_cache=keep)
        # Without O_TRUNC, opened for update (r+b, fio) or append (the kernel writes at
        # the file's size): bytes not written again come from the current version,
        # copied into the new one at close (whole units inside their target).
        return await self._open_write(inode, path, ctx, update=not flags & os.O_TRUNC)

    def _open_read(self, path: str) -> StripedReader:
        return self.ns.open(path, "rb")

    async def _open_write(
        self, ino: int, path: str, ctx: pyfuse3.RequestContext, update: bool
    ) -> pyfuse3.FileInfo:
        joined = await self._join(path, ctx, truncate=not update)
        if joined is not None:
            return joined
        if not await self._released(path):
            log(f"{path}: already open for writing on this node")
            raise pyfuse3.FUSEError(errno.ETXTBSY)
        # After the wait: the previous writer's version is the one to update.
        base = await self._run(self.ns.manifest, path) if update else None
        writer = StripedWriter(self.ns, path, base=base, stage=self.stage)
        self._writing[path] = writer
        fh = next(self._next_fh)
        self._handles[fh] = self._owner[writer] = _Handle(
            ino, path, writer=writer, openers={fh: _tgid(ctx.pid)}
        )
        self._versions.pop(ino, None)
        # Direct I/O: writes reach the daemon from the writer's own pages, with no copy
        # in the page cache to fill and drop at release; and the kernel refuses a shared
        # writable mmap of the handle (ENODEV), whose pages it would write back after the
        # close that published the file (np.memmap closes its descriptor at once).
        return pyfuse3.FileInfo(fh=fh, direct_io=True)

    async def _join(
        self, path: str, ctx: pyfuse3.RequestContext, truncate: bool
    ) -> pyfuse3.FileInfo | None:
        """A second descriptor on a file open for writing on this node, as on a local
        disk: it writes into the same new version, which the last release commits.
        tensorstore (Orbax's files) opens its ``<key>.__lock`` file twice, once to hold
        the lock and write, once to check the lock file is still the one at that name.
        None: nobody writes ``path`` (or its writer is closing, or failed): a new writer."""
        w = self._writing.get(path)
        h = self._owner.get(w) if w is not None else None
        # Decided here, in trio's thread: a release pops its opener and decides whether
        # it is the last one without a wait in between, so a handle with openers left
        # is not being closed.
        if w is None or h is None or not h.openers or h.failed or w.closed:
            return None
        fh = next(self._next_fh)
        h.openers[fh] = _tgid(ctx.pid)
        self._handles[fh] = h
        if truncate:
            try:
                await self._run(self._locked, h, w.truncate, 0)
            except BaseException:
                self._handles.pop(fh, None)
                h.openers.pop(fh, None)
                raise
        log(f"{path}: opened for writing again on this node; one new version for both")
        return pyfuse3.FileInfo(fh=fh, direct_io=True)

    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        path = self._child(parent_inode, name, creating=True)
        if path == LOG_NAME:
            raise pyfuse3.FUSEError(errno.EEXIST)
        kind = await self._run(self._kind, path)
        if kind is True:
            raise pyfuse3.FUSEError(errno.EISDIR)
        if kind is not None and flags & os.O_EXCL:
            raise pyfuse3.FUSEError(errno.EEXIST)
        ino = self._ino(path)
        info = await self._open_write(ino, path, ctx, update=not flags & os.O_TRUNC)
        # Other nodes see the name from the first commit on; this node sees the writer.
        return info, self._attrs(ino, self._writing[path])

    # pyfuse3 replies with any buffer (PyObject_GetBuffer), though its stub says bytes.
    async def read(self, fh: int, off: int, size: int) -> bytes | memoryview:  # type: ignore[override]
        h = self._handles[fh]
        if h.log:
            text: bytes = log.text()
            return text[off : off + size]
        if h.writer is not None:  # open for reading and writing: what was written so far
            got: bytes = await self._run(self._locked, h, h.writer.pread, off, size)
            self.bytes_read += len(got)
            return got
        if h.reader is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        # Read-ahead keeps most reads in memory: served here, without a thread hop, as
        # views of the verified units (pyfuse3 takes any buffer: no copy before the kernel's).
        # A read that must wait keeps its units while later reads go past it (``pin``).
        units = h.reader.pin(off, size)
        try:
            data = h.reader.pread_ready(off, size)
            if data is None:
                data = await self._run(h.reader.pview, off, size)
        finally:
            h.reader.unpin(units)
        self.bytes_read += len(data)
        self.reads += 1
        return data

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        h = self._handles[fh]
        if h.writer is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        if h.failed:
            raise pyfuse3.FUSEError(h.errno)
        # Most of a sequential save only fills the unit in memory: done here, without a
        # thread hop (which cost more CPU than the copy); the rest goes to a thread.
        quick = self._write_nowait(h, off, buf)
        if quick is not None:
            self.bytes_written += quick
            return quick
        n: int = await self._run(self._locked, h, h.writer.pwrite, off, buf)
        self.bytes_written += n
        return n

    @staticmethod
    def _write_nowait(h: _Handle, off: int, buf: bytes) -> int | None:
        """The write, if it needs no waiting (the handle's lock is free, and the writer
        takes it as an append in memory: :meth:`StripedWriter.pwrite_nowait`); else None."""
        assert h.writer is not None
        if not h.lock.acquire(blocking=False):
            return None  # a commit or an upload of this handle is under way: in turn
        try:
            if h.failed:
                raise pyfuse3.FUSEError(h.errno)
            return h.writer.pwrite_nowait(off, buf)
        except ValueError:  # closed meanwhile: as the thread would have answered
            raise pyfuse3.FUSEError(errno.EBADF) from None
        finally:
            h.lock.release()

    async def flush(self, fh: int) -> None:
        h = self._handles[fh]
        if h.writer is not None:
            await self._run(self._finish, h, False, h.openers.get(fh, 0))

    async def fsync(self, fh: int, datasync: bool) -> None:
        await self.flush(fh)

    async def release(self, fh: int) -> None:
        h = self._handles.pop(fh)
        if h.reader is not None:
            h.reader.close()
        if h.writer is not None:
            opener = h.openers.pop(fh, 0)
            if h.openers:  # another descriptor still writes: its release commits
                return
            try:
                await self._run(self._finish, h, True, opener)
            finally:
                # The kernel took the writer's size (0 after O_TRUNC) as the file's; after
                # a commit or an abort it must ask again. Not from inside this request.
                threading.Thread(target=_invalidate, args=(h.ino,), daemon=True).start()

    def _finish(self, h: _Handle, last: bool, opener: int) -> None:
        """Commit the handle's writes (close, fsync), or drop them when the writer died
        (``opener``: the process whose descriptor this is)."""
        w = h.writer
        assert w is not None
        with h.lock:
            if w.closed:
                return
            if h.unlinked:
                if last:
                    w.abort()
                    if h.orphan is not None:
                        self.ns.delete_units(h.orphan)
                    self._owner.pop(w, None)
                    with self._lock:
                        self._unlinked.pop(h.ino, None)
                        if h.ino not in self._inodes.values():
                            self._paths.pop(h.ino, None)
                return
            killed = died_of_signal(opener)
            if killed and not last and len(h.openers) > 1:
                return  # another process's descriptor writes on: its close decides
            if h.failed or killed:
                why = h.failed or f"process {opener} was killed while writing"
                if h.errno == errno.EDQUOT:  # the line above says whose quota, and why
                    why = "a write would pass the quota: EDQUOT"
                self.dropped += 1
                log(f"{h.path}: new version dropped ({why}); the previous version stays")
                w.abort()
                self._writing.pop(h.path, None)
                self._owner.pop(w, None)
                if h.failed:
                    raise OSError(h.errno, f"{h.path}: {h.failed}")
                return
            before = w.committed
            if last:
                try:
                    w.close()
                except BaseException as exc:
                    self.dropped += 1
                    why = "EDQUOT" if isinstance(exc, CkptQuotaExceeded) else describe(exc)
                    log(f"{h.path}: new version dropped at close ({why}); the previous stays")
                    raise
                finally:
                    self._writing.pop(h.path, None)
                    self._owner.pop(w, None)
            elif w.size > 0 or before is not None:
                # A close of one of several descriptors (a shell's dup2) before anything
                # was written must not replace the previous version with an empty one.
                w.commit()
            m = w.committed
            if m is not None and m is not before:
                self.committed += 1
                log(
                    f"{h.path}: committed version {m.version} ({m.size} bytes, "
                    f"{m.unit_count} units)"
                )

    async def symlink(
        self, parent_inode: int, name: bytes, target: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        """A relative link inside the namespace (``latest -> checkpoint-1200``): EPERM
        for an absolute target, EXDEV for one that climbs out (:func:`check_link`)."""
        path = self._child(parent_inode, name, creating=True)
        if path == LOG_NAME:
            raise pyfuse3.FUSEError(errno.EEXIST)
        link = await self._run(self.ns.symlink, path, os.fsdecode(target))
        return self._attrs(self._ino(path), link)

    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        path = self._path(inode)
        node = await self._run(self.ns.node, path)
        if not isinstance(node, Symlink):
            raise pyfuse3.FUSEError(errno.EINVAL)
        return os.fsencode(node.target)

    async def link(
        self, inode: int, new_parent_inode: int, new_name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        # link(2) names EPERM for "this filesystem has none".
        log(
            f"hard link {os.fsdecode(new_name)!r} refused: a checkpoint mount holds only files, "
            "directories and relative symlinks (copy the file, rename it, or symlink it)"
        )
        raise self._refuse("not_permitted", errno.EPERM)

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 1 << 20
        s.f_blocks = s.f_bfree = s.f_bavail = 1 << 30
        tightest = self.ns.quota.tightest() if self.ns.quota is not None else None
        if tightest is not None:  # df shows the quota as of the last count
            s.f_blocks = tightest.limit >> 20
            s.f_bfree = s.f_bavail = max(0, tightest.limit - tightest.used) >> 20
        s.f_files = s.f_ffree = s.f_favail = 1 << 30
        s.f_namemax = 255
        return s

    def abort_all(self) -> None:
        """Drop writes still open at unmount: nobody closed them, so nobody finished them."""
        for h in {id(h): h for h in self._handles.values()}.values():
            if h.writer is not None and not h.writer.closed:
                self.dropped += 1
                log(f"{h.path}: still open for writing at unmount; new version dropped")
                h.writer.abort()
                if h.orphan is not None:  # unlinked while open: nothing names it now
                    self.ns.delete_units(h.orphan)  # best effort, as gc is
            if h.reader is not None:
                h.reader.close()


def _invalidate(ino: int) -> None:
    with contextlib.suppress(Exception):
        pyfuse3.invalidate_inode(ino)


def mount_options(ns: Namespace) -> set[str]:
    return {
        # /proc/mounts is every user's to read: it names no namespace (docs/security.md).
        "fsname=bootseer-ckpt:job",
        "subtype=bootseer-ckpt",
        "default_permissions",
        "allow_other",
        "nosuid",
        "nodev",
        "noatime",
    }
