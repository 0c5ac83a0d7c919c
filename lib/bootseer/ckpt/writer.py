"""The parallel writer: a new version of a striped file, committed by its manifest.

Bytes are cut into units as they come; each full unit is checksummed and uploaded
(to a ``file://`` target past the page cache, ``O_DIRECT``) by a pool of
``max_inflight`` threads (the writer blocks when that many are pending, so memory
stays bounded). :meth:`StripedWriter.commit` (``close``,
``fsync`` through the mount) uploads the last partial unit, writes the manifest (the
switch to the new version) and then deletes the previous version's units. Leaving
the ``with`` block by an exception aborts instead: the previous version stays.

Bytes that cannot stream (written ahead of the stream, or into a unit already
uploaded) wait in a :class:`~bootseer.ckpt.stage.Stage` when the writer has one (the
mount daemon's); the commit streams them in order and re-uploads, under new names, the
units they rewrite. ``truncate`` before writing only sets the size.

    >>> with ns.open("step100/model.pt", "wb") as f:     # doctest: +SKIP
    ...     torch.save(state, f)
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import io
import mmap
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING

from bootseer import digest as digests
from bootseer.ckpt.errors import CkptError, CkptIOError, CkptQuotaExceeded
from bootseer.ckpt.manifest import CHECKSUM, Manifest, new_version, unit_checksum
from bootseer.ckpt.names import check_path
from bootseer.ckpt.reader import StripedReader
from bootseer.directio import Buffers
from bootseer.errors import StoreError, describe

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

    from bootseer.ckpt.layout import Layout
    from bootseer.ckpt.stage import Stage


class StripedWriter(io.RawIOBase):
    """A new version of ``path``.

    ``base``: the file's current version, for a writer opened without truncating it
    (``r+b``, fio): bytes never written come from it. ``stage``: where bytes written out
    of order wait (the mount daemon's :class:`~bootseer.ckpt.stage.Stage`); without one
    (the Python API) a write that cannot stream fails with :class:`CkptIOError`.
    """

    def __init__(
        self,
        ns: Layout,
        path: str,
        base: Manifest | None = None,
        stage: Stage | None = None,
    ) -> None:
        super().__init__()
        check_path(path)  # before anything is uploaded
        self.ns = ns
        self.path = path
        self.name = f"{ns.name}:{path}"
        self.version = new_version()
        self.targets = tuple(s.uri for s in ns.targets)
        self.unit_size = ns.unit_size
        self.size = base.size if base is not None else 0  # the file's size as the job sees it
        self.committed: Manifest | None = None
        self._pos = 0  # where write() goes on
        # Page-aligned buffers for the units being filled and uploaded: the namespace's,
        # used again by this file's next units and by the next files read or written.
        self._buffers = ns.buffers
        self._buf = _Unit(self._buffers, 0)  # the unit being filled: [_frontier - len, _frontier)
        self._frontier = 0  # bytes [0, _frontier) are streamed: uploaded units and _buf
        self._units: list[tuple[str, str] | None] = []  # full units, filled in as uploads finish
        self._pending: set[cf.Future[None]] = set()
        self._slots = threading.BoundedSemaphore(ns.max_inflight)
        self._pool = cf.ThreadPoolExecutor(ns.max_inflight, thread_name_prefix="ckpt-write")
        self._uploaded: list[tuple[str, int, str]] = []  # (version, index, name) of every object
        self._generation = 0
        self._base = base
        self._base_len = self.size  # bytes of base that survive truncation
        self._base_reader: StripedReader | None = None
        self._stage = stage.file(self.name) if stage is not None else None
        self._cached: tuple[int, str, bytes] | None = None  # the last unit read back
        self.copied = 0  # bytes of the previous version copied inside the targets
        # A file opened with O_TRUNC and closed at once is an empty version; one opened
        # for update and closed untouched publishes nothing.
        self._dirty = base is None
        self._aborted = False
        self._credit: int | None = None  # the replaced version's bytes, once looked up

    # -- io.RawIOBase
    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def write(self, data: ReadableBuffer) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        n = self.pwrite(self._pos, data)
        self._pos += n
        return n

    @property
    def staged_bytes(self) -> int:
        return self._stage.staged if self._stage is not None else 0

    def pwrite(self, offset: int, data: ReadableBuffer) -> int:
        """Write at ``offset``. At the end of the stream the bytes stream to the targets;
        inside the unit being filled they patch it; elsewhere (ahead of the stream, or
        in a unit already uploaded) they wait in the stage until the stream reaches them
        or the commit re-uploads the units they change."""
        if self.closed:
            raise ValueError("I/O operation on closed file")
        mv = memoryview(data).cast("B")
        n = len(mv)
        if n == 0:
            return 0
        end = offset + n
        self._dirty = True
        pos = offset
        while pos < end:
            part = mv[pos - offset :]
            start = self._frontier - len(self._buf)
            if pos < start:  # behind the stream: a unit already uploaded
                take = min(end, start) - pos
                self._stage_put(pos, part[:take], "goes back before byte " + str(start))
            elif pos < self._frontier:  # inside the unit being filled
                take = min(end, self._frontier) - pos
                self._buf[pos - start : pos - start + take] = part[:take]
            elif pos == self._frontier:  # the stream goes on
                take = end - pos
                if self._stage is not None:
                    self._stage.drop(pos, end)  # superseded
                self._append(part)
                self._drain()
            elif self._stage is None:  # a gap, without a stage: streamed as zeros
                self._fill(pos)
                take = 0
            else:  # a gap: staged until the stream reaches it
                take = end - pos
                self._stage.put(pos, part)
            pos += take
        self.size = max(self.size, end)
        return n

    def pwrite_nowait(self, offset: int, data: ReadableBuffer) -> int | None:
        """:meth:`pwrite` if it is a plain append that stays inside the unit being filled
        (a memory copy: no upload, no quota count, no staging, nothing that waits), else
        None and nothing is written. The FUSE daemon serves such writes (7 in 8 of a
        sequential save, at 1 MiB requests and 8 MiB units) on its event loop, without a
        thread hop each, and hands the rest to a thread as :meth:`pwrite`."""
        if self.closed:
            raise ValueError("I/O operation on closed file")
        mv = memoryview(data).cast("B")
        n = len(mv)
        if (
            offset != self._frontier
            or len(self._buf) + n >= self.unit_size
            or (self._stage is not None and self._stage.extents)
        ):
            return None
        self._dirty = True
        self._buf += mv
        self._frontier += n
        self.size = max(self.size, self._frontier)
        return n

    def truncate(self, size: int | None = None) -> int:
        """Set the file's size. Growing (or shrinking to a size not yet streamed) only
        fixes the size: ``ftruncate`` to the final size, then writes front to back, stream
        as usual. Shrinking into what was streamed starts the stream again over what is
        kept (read back from the targets when the commit needs it)."""
        if self.closed:
            raise ValueError("I/O operation on closed file")
        size = self._pos if size is None else size
        if size < 0:
            raise ValueError(f"negative size {size}")
        start = self._frontier - len(self._buf)
        if self._stage is not None:
            self._stage.drop(size, max(size, self.size, self._frontier))
        if size >= start:
            if size < self._frontier:
                del self._buf[size - start :]
                self._frontier = size
        else:
            self._restart(size)
        self._base_len = min(self._base_len, size)
        self.size = size
        self._dirty = True
        return size

    def pread(self, offset: int, n: int) -> bytes:
        """The file's bytes as written so far (a file open for reading and writing, fio's
        verify pass): what the commit would publish now."""
        end = min(self.size, offset + n)
        out = bytearray()
        pos = offset
        while pos < end:
            start = self._frontier - len(self._buf)
            if pos < start:
                index = pos // self.unit_size
                take = min(end, (index + 1) * self.unit_size, start) - pos
                lo = pos - index * self.unit_size
                chunk = bytearray(self._read_unit(index)[lo : lo + take])
                if self._stage is not None:  # rewrites not yet applied
                    for s, e in self._stage.extents.spans(pos, pos + take):
                        chunk[s - pos : e - pos] = self._stage.get(s, e - s)
                out += chunk
            elif pos < self._frontier:
                take = min(end, self._frontier) - pos
                out += self._buf[pos - start : pos - start + take]
            else:  # ahead of the stream: staged, the base's (read ahead by its reader), zeros
                take = min(end - pos, 16 * self.unit_size)
                out += self._ahead(pos, take)
            pos += take
        return bytes(out)

    def flush(self) -> None:
        """Buffered bytes stay buffered until a unit is full: only :meth:`commit` publishes."""

    def commit(self) -> Manifest:
        """Publish what was written so far as the file's current version (a file opened
        for update and not written keeps its version: that one is returned)."""
        if self.closed or self._aborted:
            raise ValueError(f"{self.name}: commit after close or abort")
        if not self._dirty:
            current = self.committed or self._base
            assert current is not None  # only a writer with a base starts clean
            return current
        self._fill(self.size)
        self._wait_all()
        self._apply_rewrites()
        units: list[tuple[str, str]] = [u for u in self._units if u is not None]
        partial = None
        if self._buf:
            self._generation += 1
            partial = f"{len(units)}.{self._generation}"
            self._upload(len(units), partial, bytes(self._buf))
            units.append((partial, unit_checksum(self._buf.view())))
        m = Manifest(
            version=self.version,
            size=self.size,
            unit_size=self.unit_size,
            targets=self.targets,
            units=tuple(units),
            mtime=time.time(),
        )
        try:
            previous = self.ns.manifest(self.path)
        except CkptIOError:
            previous = None  # damaged or not sealed: replaced, its units left to gc
        # The manifest's bytes (its seal aside): serialised once more only under a quota.
        size = len(m.to_json()) if self.ns.quota is not None else 0
        self._charge_commit(size, previous)
        try:
            self.ns.commit(self.path, m)
        except (OSError, StoreError) as exc:
            self._landed(size, False)
            raise CkptIOError(f"{self.name}: cannot write the manifest: {describe(exc)}") from None
        except BaseException:
            self._landed(size, False)
            raise
        self._landed(size, True)
        if previous is not None and previous.version != self.version:
            self.ns.delete_units(previous)
        self.committed = m
        self._credit = None  # the version it replaced is gone: no room left to borrow
        self._base = None  # all of it that counts is in this version now
        self._close_base()
        self._delete_unnamed(m)
        self._dirty = False
        return m

    def close(self) -> None:
        if self.closed:
            return
        try:
            if not self._aborted:
                self.commit()
        except BaseException:
            self._abort()
            raise
        finally:
            self._pool.shutdown(wait=True)
            self._release()
            super().close()

    def abort(self) -> None:
        """Drop this version: the file keeps whatever version it had (or last committed)."""
        if not self.closed:
            self._abort()
            self._pool.shutdown(wait=True)
            self._release()
            super().close()

    def rename(self, path: str) -> None:
        """The file was renamed while open (safetensors renames its temporary file before
        closing it): the commit goes to ``path``."""
        check_path(path)
        self.path = path
        self.name = f"{self.ns.name}:{path}"

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is not None:
            self.abort()
        else:
            self.close()

    # -- the stream
    def _append(self, data: memoryview | bytes) -> None:
        mv = memoryview(data).cast("B")
        done = 0
        while done < len(mv):
            take = min(self.unit_size - len(self._buf), len(mv) - done)
            self._buf += mv[done : done + take]
            done += take
            self._frontier += take
            if len(self._buf) == self.unit_size:
                self._flush_unit()

    def _drain(self) -> None:
        """Move staged bytes that the stream has reached into it."""
        if self._stage is None:
            return
        while True:
            nxt = self._stage.extents.first_at_or_after(self._frontier)
            if nxt is None or nxt[0] != self._frontier:
                return
            s, e = nxt
            take = min(e - s, self.unit_size)
            data = self._stage.get(s, take)
            self._stage.drop(s, s + take)
            self._append(data)

    def _ahead(self, pos: int, n: int) -> bytes:
        """Bytes at ``[pos, pos + n)`` ahead of the stream: staged, else the base's, else zeros."""
        out = bytearray(n)
        if pos < self._base_len:
            take = min(n, self._base_len - pos)
            out[:take] = self._base_bytes(pos, take)
        if self._stage is not None:
            for s, e in self._stage.extents.spans(pos, pos + n):
                out[s - pos : e - pos] = self._stage.get(s, e - s)
        return bytes(out)

    def _fill(self, size: int) -> None:
        """Stream up to ``size``: staged bytes, the base's where nothing was written, zeros."""
        while self._frontier < size:
            if self._copy_base_unit(size):
                continue
            nxt = self._stage.extents.first_at_or_after(self._frontier) if self._stage else None
            gap_end = min(size, nxt[0]) if nxt is not None else size
            if gap_end > self._frontier:
                take = min(gap_end - self._frontier, self.unit_size - len(self._buf))
                self._append(self._ahead(self._frontier, take))
            self._drain()

    def _copy_base_unit(self, size: int) -> bool:
        """At a unit boundary, a whole unit of the previous version that nothing rewrote
        (an update, ``r+b``) is copied inside its target (S3: CopyObject), not read back
        through this node and uploaded again. Each version still owns its units: a copy,
        not a reference, so replacing or removing a version never touches another's."""
        base, u = self._base, self.unit_size
        if base is None or self._buf or self._frontier % u or base.unit_size != u:
            return False
        index = self._frontier // u
        end = self._frontier + u
        if end > min(size, self._base_len, base.size) or index >= len(base.units):
            return False
        if self._stage is not None and self._stage.extents.spans(self._frontier, end):
            return False
        uri = self.targets[index % len(self.targets)]
        if base.targets[index % len(base.targets)] != uri:
            return False
        name, digest = base.units[index]
        if digests.algorithm(digest) != CHECKSUM:  # one hash per version: hashed anew
            return False
        self._charge(u)
        self._units.append(None)
        self._slots.acquire()
        try:
            fut = self._pool.submit(self._copy_unit, index, base.version, name, digest)
        except BaseException:
            self._slots.release()
            self._landed(u, False)
            raise
        self._pending.add(fut)
        fut.add_done_callback(lambda _f: self._slots.release())
        self._frontier = end
        return True

    def _copy_unit(self, index: int, version: str, name: str, digest: str) -> None:
        uri = self.targets[index % len(self.targets)]
        self._uploaded.append((self.version, index, str(index)))
        stored = False
        try:
            self.ns.store_for(uri).copy(
                self.ns.unit_key(version, name), self.ns.unit_key(self.version, str(index))
            )
            stored = True
        except (OSError, StoreError, CkptError) as exc:
            raise CkptIOError(
                f"{self.name}: cannot copy unit {index} of the previous version on {uri}: "
                f"{describe(exc)}"
            ) from None
        finally:
            self._landed(self.unit_size, stored)
        self._units[index] = (str(index), digest)
        self.copied += self.unit_size

    def _base_bytes(self, pos: int, n: int) -> bytes:
        if self._base is None:
            return bytes(n)
        if self._base_reader is None:
            self._base_reader = StripedReader(self.ns, self.path, self._base)
        data = self._base_reader.pread(pos, n)
        if len(data) != n:
            raise CkptIOError(f"{self.name}: the previous version ended early at byte {pos}")
        return data

    def _close_base(self) -> None:
        if self._base_reader is not None:
            with contextlib.suppress(Exception):
                self._base_reader.close()
            self._base_reader = None

    def _stage_put(self, pos: int, data: memoryview, why: str) -> None:
        if self._stage is None:
            raise CkptIOError(
                f"{self.name}: write at offset {pos} {why}: this writer streams front to back "
                "(the checkpoint mount stages such writes)"
            )
        self._stage.put(pos, data)

    def _restart(self, keep: int) -> None:
        """Shrink into the streamed part: a new version whose base is the first ``keep``
        bytes of the stream so far."""
        old: Manifest | None = None
        if keep > 0:
            self._wait_all()
            self._apply_rewrites()
            units: list[tuple[str, str]] = [u for u in self._units if u is not None]
            if self._buf:
                self._generation += 1
                name = f"{len(units)}.{self._generation}"
                self._upload(len(units), name, bytes(self._buf))
                units.append((name, unit_checksum(self._buf.view())))
            old = Manifest(
                version=self.version,
                size=self._frontier,
                unit_size=self.unit_size,
                targets=self.targets,
                units=tuple(units),
            )
        else:
            self._wait_all()
        self._close_base()
        self._base = old
        self._base_len = keep
        self.version = new_version()
        self._units = []
        self._buf = _Unit(self._buffers, 0)
        self._frontier = 0
        self._cached = None

    def _read_unit(self, index: int) -> bytes:
        """Unit ``index`` of this version as uploaded (waiting for its upload)."""
        self._wait_all()
        entry = self._units[index]
        assert entry is not None
        name, digest = entry
        if self._cached is not None and self._cached[:2] == (index, name):
            return self._cached[2]
        uri = self.targets[index % len(self.targets)]
        try:
            data = self.ns.store_for(uri).read_bytes(self.ns.unit_key(self.version, name))
        except (OSError, StoreError) as exc:
            raise CkptIOError(
                f"{self.name}: cannot read back unit {index} from {uri}: {describe(exc)}"
            ) from None
        if not digests.matches(data, digest):
            raise CkptIOError(f"{self.name}: unit {index} on {uri} changed after its upload")
        self._cached = (index, name, data)
        return data

    def _apply_rewrites(self) -> None:
        """Re-upload, under new names, the uploaded units that staged bytes rewrite."""
        if self._stage is None or not self._stage.extents:
            return
        start = self._frontier - len(self._buf)
        touched = sorted(
            {
                i
                for s, e in self._stage.extents.spans(0, start)
                for i in range(s // self.unit_size, (e - 1) // self.unit_size + 1)
            }
        )
        for index in touched:
            lo = index * self.unit_size
            unit = bytearray(self._read_unit(index))
            for s, e in self._stage.extents.spans(lo, lo + len(unit)):
                unit[s - lo : e - lo] = self._stage.get(s, e - s)
            self._generation += 1
            name = f"{index}.{self._generation}"
            self._upload(index, name, unit)
            self._units[index] = (name, unit_checksum(unit))
            self._stage.drop(lo, lo + len(unit))
        self._cached = None

    def _delete_unnamed(self, m: Manifest) -> None:
        """Delete the objects this writer uploaded that ``m`` does not name: earlier
        partial units, units rewritten since, a version restarted by a truncate."""
        named = {(m.version, name) for name, _ in m.units}
        keep = []
        for version, index, name in self._uploaded:
            if (version, name) in named:
                keep.append((version, index, name))
                continue
            with contextlib.suppress(Exception):
                self.ns.store_for(self.targets[index % len(self.targets)]).delete(
                    self.ns.unit_key(version, name)
                )
        self._uploaded = keep

    def _release(self) -> None:
        self._close_base()
        self._buf.done()  # the unit last begun: uploaded as a copy (commit) or dropped
        if self._stage is not None:
            self._stage.close()

    # -- units
    def _charge(self, n: int) -> None:
        """Room for ``n`` more stored bytes in the quota, before they are uploaded
        (:class:`~bootseer.ckpt.errors.CkptQuotaExceeded` leaves this writer as it was).

        A file written anew under its name frees its previous version at the commit, so
        it may use that version's room meanwhile (``latest.pt`` saved again and again
        needs no room twice its size): looked up at the first refusal only, so writes
        with room to spare pay nothing for it."""
        quota = self.ns.quota
        if quota is None:
            return
        try:
            quota.charge(n, self.name, self._credit or 0)
        except CkptQuotaExceeded:
            if self._credit is not None:
                raise
            self._credit = self._replaced_bytes()
            if not self._credit:
                raise
            quota.charge(n, self.name, self._credit)

    def _charge_commit(self, n: int, previous: Manifest | None) -> None:
        """Room for the manifest (``n`` bytes), the commit's charge. A writer that
        borrowed room may keep only that of the version this commit replaces
        (``previous``, read just now): another writer of the name may have committed
        since the room was looked up, deleting the version it was borrowed from, and
        this one's units would stay past the quota (by a whole version each round).
        Refused, the new version is dropped as at any refusal."""
        quota = self.ns.quota
        if quota is None:
            return
        if self._credit is None:
            self._charge(n)  # never borrowed: as any upload
            return
        self._credit = self._stored_bytes(previous)
        quota.charge(n, self.name, self._credit)

    def _replaced_bytes(self) -> int:
        """Stored bytes of the version the commit will replace (0: none, or unreadable)."""
        try:
            m = self.ns.manifest(self.path)
        except (CkptError, StoreError, OSError):
            return 0
        return self._stored_bytes(m)

    def _stored_bytes(self, m: Manifest | None) -> int:
        if m is None or m.version == self.version:
            return 0
        return m.size + len(m.to_json())

    def _landed(self, n: int, stored: bool) -> None:
        if self.ns.quota is not None:
            self.ns.quota.landed(n, stored)

    def _flush_unit(self) -> None:
        self._charge(len(self._buf))
        index = len(self._units)
        data, self._buf = self._buf, _Unit(self._buffers, self.unit_size)
        self._units.append(None)
        self._slots.acquire()
        try:
            fut = self._pool.submit(self._upload_full, index, data)
        except BaseException:
            self._slots.release()
            self._landed(len(data), False)
            raise
        self._pending.add(fut)
        fut.add_done_callback(lambda _f: self._slots.release())
        # Surface a failed upload at the next write, not only at commit.
        for f in [f for f in self._pending if f.done()]:
            self._pending.discard(f)
            f.result()

    def _upload_full(self, index: int, unit: _Unit) -> None:
        data = unit.view()
        try:
            digest = unit_checksum(data)
            # Page-aligned and whole blocks: a file:// target takes it with O_DIRECT as
            # it is, without the copy into an aligned buffer.
            self._upload(index, str(index), data, charged=True)
        finally:
            with contextlib.suppress(BufferError):  # a store that still holds it: at GC
                data.release()
            unit.done()
        self._units[index] = (str(index), digest)

    def _upload(
        self, index: int, name: str, data: bytes | bytearray | memoryview, charged: bool = False
    ) -> None:
        if not charged:
            self._charge(len(data))
        uri = self.targets[index % len(self.targets)]
        self._uploaded.append((self.version, index, name))
        stored = False
        try:
            self.ns.store_for(uri).write_bytes(
                self.ns.unit_key(self.version, name), data, atomic=False, direct=True
            )
            stored = True
        except (OSError, StoreError, CkptError) as exc:
            raise CkptIOError(
                f"{self.name}: cannot upload unit {index} to target {uri}: {describe(exc)}"
            ) from None
        finally:
            self._landed(len(data), stored)

    def _wait_all(self) -> None:
        pending, self._pending = self._pending, set()
        errors = [f.exception() for f in cf.as_completed(pending)]
        for e in errors:
            if e is not None:
                raise e

    def _abort(self) -> None:
        self._aborted = True
        for f in self._pending:
            f.cancel()
        with contextlib.suppress(BaseException):
            cf.wait(self._pending)
        self._pending = set()
        # Delete what no committed manifest names (all of it when nothing was committed).
        named = set()
        if self.committed is not None:
            named = {(self.committed.version, n) for n, _ in self.committed.units}
        for version in {v for v, _, _ in self._uploaded}:
            if not any(v == version for v, _ in named):
                for store in self.ns.targets:
                    with contextlib.suppress(Exception):
                        store.delete_prefix(f"{self.ns.name}/units/{version}")
        for version, index, name in self._uploaded:
            if (version, name) not in named and any(v == version for v, _ in named):
                with contextlib.suppress(Exception):
                    self.ns.store_for(self.targets[index % len(self.targets)]).delete(
                        self.ns.unit_key(version, name)
                    )


class _Unit:
    """The unit being filled, in a page-aligned buffer of :class:`Buffers` (used again
    once its upload is done and no view of it is left): filled in place, hashed and
    written to a ``file://`` target with ``O_DIRECT`` from where it is. A ``bytearray``
    grew by reallocation, was fresh memory for every unit, and had to be copied into an
    aligned buffer for ``O_DIRECT``. Takes what a ``bytearray`` took here: ``len``,
    ``+=``, slices read, written and cut from the end, ``bytes()``. Sized ``want`` (the
    unit size once a unit was full: the next will likely be); a first unit starts small,
    for a writer of a small file, and doubles (a copy) as it fills."""

    __slots__ = ("_buffers", "_mem", "_n")

    def __init__(self, buffers: Buffers, want: int) -> None:
        self._buffers = buffers
        self._mem: mmap.mmap | None = buffers.get(want) if want else None
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def _room(self, n: int) -> mmap.mmap:
        mem = self._mem
        if mem is None or len(mem) < n:
            want = max(n, 2 * len(mem) if mem is not None else 64 << 10)
            grown = self._buffers.get(want, least=want)
            if mem is not None:
                grown[: self._n] = mem[: self._n]
                self._buffers.retire(memoryview(mem))
            mem = self._mem = grown
        return mem

    def __iadd__(self, data: ReadableBuffer) -> _Unit:
        mv = memoryview(data).cast("B")
        end = self._n + len(mv)
        self._room(end)[self._n : end] = mv
        self._n = end
        return self

    def __setitem__(self, where: slice, data: ReadableBuffer) -> None:
        lo, hi, _ = where.indices(self._n)
        assert self._mem is not None and hi - lo == len(memoryview(data).cast("B"))
        self._mem[lo:hi] = data

    def __getitem__(self, where: slice) -> memoryview:
        return self.view()[where]

    def __delitem__(self, where: slice) -> None:
        lo, hi, _ = where.indices(self._n)
        assert hi == self._n, "only the end is cut"
        self._n = lo

    def __bytes__(self) -> bytes:
        return bytes(self._mem[: self._n]) if self._mem is not None else b""

    def view(self) -> memoryview:
        """The unit's bytes (a view: release it, or let it go, before :meth:`done`)."""
        if self._mem is None:
            return memoryview(b"")
        return memoryview(self._mem)[: self._n]

    def done(self) -> None:
        """Uploaded: its buffer may be used again once no view of it is left."""
        if self._mem is not None:
            self._buffers.retire(memoryview(self._mem))
            self._mem = None
        self._n = 0
