"""Direct I/O for big files read or written once: past the page cache (``O_DIRECT``).

Fresh page-cache pages cost this machine's VM 0.4-1.4 CPU-s per GiB to fill, more than
hashing the same bytes; a checkpoint unit or a piece written once and read once by
another process gains nothing from them. Writes go through one page-aligned buffer per
thread (one memory copy); reads land in page-aligned buffers that :class:`Buffers` hands
out again once nothing holds them. Where a filesystem has no ``O_DIRECT`` (tmpfs), or
refuses it, both fall back to ordinary I/O::

    >>> fd = os.open("/tmp/doc-direct", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    >>> write_all(fd, b"x" * 5000, direct=True)
    >>> os.close(fd)
    >>> bytes(read_direct("/tmp/doc-direct")) == b"x" * 5000
    True
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import mmap
import os
import sys
import threading
import weakref

DIRECT_ALIGN = 4096  # O_DIRECT's alignment of offsets, lengths, buffers (block sizes up to it)
_IOV_MAX = os.sysconf("SC_IOV_MAX")  # the most parts one pwritev takes (1024 on Linux)
_direct_buf = threading.local()
_HUGE = 2 << 20  # a transparent huge page (x86-64, arm64 with 4 KiB pages)


def _aligned(n: int) -> mmap.mmap:
    """A page-aligned buffer of at least ``n`` bytes, one per thread, kept for its next use."""
    buf: mmap.mmap | None = getattr(_direct_buf, "buf", None)
    if buf is None or len(buf) < n:
        if buf is not None:
            buf.close()
        buf = _direct_buf.buf = mmap.mmap(-1, max(n, DIRECT_ALIGN))
        _huge(buf)
    return buf


def pwrite_direct(fd: int, mv: memoryview) -> int:
    """Write the whole blocks at the start of ``mv`` to ``fd`` with ``O_DIRECT`` (from
    where they are if ``mv`` starts on a page, :func:`aligned_at`; else through an aligned
    buffer: one memory copy); how many bytes were written (0: the filesystem has no
    O_DIRECT, or refused it). ``fd`` is left without O_DIRECT for the rest."""
    n = len(mv) // DIRECT_ALIGN * DIRECT_ALIGN
    if n == 0:
        return 0
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT)
    except OSError:
        return 0
    done = 0
    try:
        if aligned_at(mv[:n]):
            view = mv[:n]
        else:
            buf = _aligned(n)
            buf[:n] = mv[:n]
            view = memoryview(buf)
        try:
            while done < n:
                got = os.pwrite(fd, view[done:n], done)
                done += got
                if got % DIRECT_ALIGN:
                    break  # a short write off a block: the rest through the page cache
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
        finally:
            view.release()
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
    return done


def _huge(buf: mmap.mmap) -> None:
    """Ask for transparent huge pages for a big buffer (``MADV_HUGEPAGE``; where the
    kernel's THP setting is ``madvise``, as Debian's is, only asked-for memory gets them):
    the kernel then faults it in, and pins it for every ``O_DIRECT`` read and every
    reply to ``/dev/fuse``, 2 MiB at a time rather than 4 KiB."""
    if len(buf) >= _HUGE and hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):
            buf.madvise(mmap.MADV_HUGEPAGE)


class Buffers:
    """Page-aligned buffers that :func:`read_direct` reads into, used again once nothing
    holds them: a fresh buffer's pages are faulted in and zeroed by the kernel, which cost
    0.9 CPU-s per GiB read on this machine's VM, against 0.08 for a buffer used again.
    The owner retires what it drops (:meth:`retire`), or what it hands on at once (the
    peers' way, :mod:`bootseer.p2p.via`); a retired buffer is taken again only when no
    view of it is left (CPython's reference count: a view handed to the kernel's reply,
    or to a caller, keeps its bytes as they are). A pool takes back only buffers it made,
    once: a buffer on two pools' lists would count a reference too many on each."""

    def __init__(self, keep: int, least: int = 0) -> None:
        """``keep``: the most buffers kept for use again; ``least``: the smallest buffer
        made (a pool shared by readers of one unit size makes each big enough for any
        unit, so a file's short last unit does not hold a place that no unit can use)."""
        self.keep = keep
        self.least = least
        self.made = 0  # buffers made so far (the others were used again)
        self._free: list[mmap.mmap] = []
        self._mine: weakref.WeakSet[mmap.mmap] = weakref.WeakSet()
        self._lock = threading.Lock()

    def get(self, n: int, least: int | None = None) -> mmap.mmap:
        """A buffer of at least ``n`` bytes: one kept for use again if any fits, else a
        fresh one of at least ``least`` bytes (the pool's own ``least`` unless given: a
        writer's first unit of a file that may stay small asks for a small one)."""
        least = self.least if least is None else least
        with self._lock:
            for i in range(len(self._free)):
                buf = self._free[i]
                # References: the list's, ``buf``'s and getrefcount's argument: no view.
                if len(buf) >= n and sys.getrefcount(buf) <= 3:
                    del self._free[i]
                    return buf
            # Private: its pages are the process's own (a shared mapping's are shmem's,
            # dearer to fault in).
            size = -(-max(n, least, 1) // DIRECT_ALIGN) * DIRECT_ALIGN
            buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            _huge(buf)
            self._mine.add(buf)
            self.made += 1
            return buf

    def held(self) -> int:
        """How many of the buffers kept for use again still have a view alive."""
        with self._lock:
            # References: the list's, the loop's and getrefcount's argument: no view.
            return sum(1 for buf in self._free if sys.getrefcount(buf) > 3)

    def retire(self, data: object) -> None:
        """``data`` (what :func:`read_direct` gave) is no longer the owner's."""
        buf = data.obj if isinstance(data, memoryview) else None
        if not isinstance(buf, mmap.mmap):
            return
        with self._lock:
            if buf not in self._mine or any(b is buf for b in self._free):
                return
            if len(buf) < self.least:
                return  # a small file's: kept, it would push out a buffer any unit can use
            self._free.append(buf)
            if len(self._free) > self.keep:
                del self._free[0]  # freed when its last view goes


def read_direct(
    path: str, buffers: Buffers | None = None, offset: int = 0, size: int | None = None
) -> bytes | memoryview:
    """The file's bytes (``size`` of them at ``offset``; None: all of it), read with
    ``O_DIRECT`` into a page-aligned buffer (of ``buffers``, else fresh; the view returned
    keeps it); through the page cache where the filesystem has no O_DIRECT."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECT)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        if size is None:
            return read_file(path, None)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return read_fd(fd, buffers, offset, size)
    finally:
        os.close(fd)


def read_fd(
    fd: int, buffers: Buffers | None = None, offset: int = 0, size: int | None = None
) -> bytes | memoryview:
    """:func:`read_direct` of an open file (``O_DIRECT`` or not: a descriptor another
    process passed); a read the file's ``O_DIRECT`` refuses is done through the page cache.
    Fewer than ``size`` bytes where the file ends before (the caller checks the length)."""
    if size is None:
        size = os.fstat(fd).st_size - offset
    if size <= 0:
        return b""
    n = -(-size // DIRECT_ALIGN) * DIRECT_ALIGN
    buf = buffers.get(n) if buffers is not None else mmap.mmap(-1, n)
    view = memoryview(buf)[:n]
    done = 0
    try:
        while done < size:
            got = os.preadv(fd, [view[done:]], offset + done)
            if got == 0:
                break  # it shrank: what there is (the caller checks the length)
            done += got
            if got % DIRECT_ALIGN and done < size:
                break
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        done = -1
    if done < 0 or (done < size and done % DIRECT_ALIGN):
        view.release()
        return _read_buffered(fd, size, offset)
    return view[: min(done, size)]


def _read_buffered(fd: int, size: int, offset: int = 0) -> bytes:
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    if flags & os.O_DIRECT:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)
    parts: list[bytes] = []
    got = 0
    while got < size:
        chunk = os.pread(fd, size - got, offset + got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def pwrite_padded(fd: int, data: bytes | bytearray | memoryview, offset: int) -> int:
    """``data`` into ``fd`` at ``offset`` (a multiple of :data:`DIRECT_ALIGN`), zero-padded
    to a whole number of ``DIRECT_ALIGN`` blocks, through the thread's page-aligned buffer
    (one memory copy): a file opened with ``O_DIRECT`` takes it past the page cache, any
    other as usual. The bytes written (``data``'s length rounded up)."""
    mv = memoryview(data).cast("B")
    n = -(-len(mv) // DIRECT_ALIGN) * DIRECT_ALIGN
    if n == 0:
        return 0
    buf = _aligned(n)
    buf[: len(mv)] = mv
    buf[len(mv) : n] = bytes(n - len(mv))
    view = memoryview(buf)
    try:
        done = 0
        while done < n:
            done += os.pwrite(fd, view[done:n], offset + done)
    finally:
        view.release()
    return n


def aligned_at(data: bytes | bytearray | memoryview) -> bool:
    """Whether ``data`` may go to an ``O_DIRECT`` write as it is: writable memory (a
    buffer of :class:`Buffers`, or any ``mmap``) starting on a page, whole pages long."""
    if len(data) % DIRECT_ALIGN:
        return False
    try:
        address = ctypes.addressof(ctypes.c_char.from_buffer(data))
    except (TypeError, ValueError):  # read-only (bytes), not contiguous, or empty
        return False
    return address % DIRECT_ALIGN == 0


def room(size: int) -> int:
    """The whole ``DIRECT_ALIGN`` blocks ``size`` bytes take padded (one for none)."""
    return max(DIRECT_ALIGN, -(-size // DIRECT_ALIGN) * DIRECT_ALIGN)


def pwritev_padded(fd: int, parts: list[bytes | bytearray | memoryview], offset: int) -> int:
    """``parts`` into ``fd`` at ``offset`` (a multiple of :data:`DIRECT_ALIGN`), one after
    another, each zero-padded to its :func:`room` (an empty part: a block of zeros), in
    one ``pwritev``: a part already page-aligned (:func:`aligned_at`:
    a run received into a :class:`Buffers` buffer) is written from where it is, with no
    copy; the others are copied into the thread's aligned buffer first. The bytes written
    (the padded lengths' sum)."""
    views = [memoryview(p).cast("B") for p in parts]
    direct = [aligned_at(v) for v in views]
    copied = sum(room(len(v)) for v, d in zip(views, direct, strict=True) if not d)
    buf = _aligned(copied) if copied else None
    scratch = memoryview(buf) if buf is not None else None
    iov: list[memoryview] = []
    at = 0
    try:
        for v, d in zip(views, direct, strict=True):
            if d:
                iov.append(v)
                continue
            assert scratch is not None
            n = room(len(v))
            scratch[at : at + len(v)] = v
            scratch[at + len(v) : at + n] = bytes(n - len(v))
            iov.append(scratch[at : at + n])
            at += n
        total = sum(len(v) for v in iov)
        done = 0
        while done < total:
            got = os.pwritev(fd, iov[:_IOV_MAX], offset + done)
            if got <= 0:
                raise OSError(errno.EIO, "a write took no bytes")
            done += got
            iov = _after(iov, got)
        return total
    finally:
        iov.clear()
        if scratch is not None:
            scratch.release()


def _after(iov: list[memoryview], n: int) -> list[memoryview]:
    """What is left of ``iov`` once its first ``n`` bytes are written."""
    out = []
    for v in iov:
        if n >= len(v):
            n -= len(v)
            continue
        out.append(v[n:])
        n = 0
    return out


def write_all(fd: int, data: bytes | bytearray | memoryview, direct: bool = False) -> None:
    """``data`` into ``fd`` from offset 0; with ``direct``, its whole blocks past the page
    cache (:func:`pwrite_direct`), the tail through it."""
    mv = memoryview(data).cast("B")
    done = pwrite_direct(fd, mv) if direct else 0
    while done < len(mv):
        done += os.pwrite(fd, mv[done:], done)


def read_file(path: str, limit: int | None) -> bytes:
    """The file's bytes (at most ``limit``) in one copy, from the page cache into the bytes
    returned (``os.read`` releases the GIL): pyarrow's stream read into a buffer of its own,
    copied again into bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        want = size if limit is None else min(size, limit)
        parts = [os.read(fd, want)] if want else []
        got = len(parts[0]) if parts else 0
        # A read cut short (a signal, 2 GiB per call) or a file that grew: the rest as it comes.
        while limit is None or got < limit:
            chunk = os.read(fd, 1 << 20 if limit is None else min(limit - got, 1 << 30))
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    if len(parts) == 1:
        return parts[0]
    return b"".join(parts)
