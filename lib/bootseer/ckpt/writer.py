"""The parallel writer: a new version of a striped file, committed by its manifest.

Bytes are cut into units as they come; each full unit is checksummed and uploaded
to its target by a pool of ``max_inflight`` threads (the writer blocks when that many
are pending, so memory stays bounded). :meth:`StripedWriter.commit` (``close``,
``fsync`` through the mount) uploads the last partial unit, writes the manifest (the
switch to the new version) and then deletes the previous version's units. Leaving
the ``with`` block by an exception aborts instead: the previous version stays.

    >>> with ns.open("step100/model.pt", "wb") as f:     # doctest: +SKIP
    ...     torch.save(state, f)
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import io
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING

from bootseer.ckpt.layout import CkptError, CkptIOError, check_path
from bootseer.ckpt.manifest import Manifest, new_version, unit_checksum
from bootseer.errors import StoreError

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

    from bootseer.ckpt.layout import Namespace


class StripedWriter(io.RawIOBase):
    def __init__(self, ns: Namespace, path: str) -> None:
        super().__init__()
        check_path(path)  # before anything is uploaded
        self.ns = ns
        self.path = path
        self.name = f"{ns.name}:{path}"
        self.version = new_version()
        self.targets = tuple(s.uri for s in ns.targets)
        self.unit_size = ns.unit_size
        self.size = 0
        self.committed: Manifest | None = None
        self._buf = bytearray()
        self._units: list[tuple[str, str] | None] = []  # full units, filled in as uploads finish
        self._pending: set[cf.Future[None]] = set()
        self._slots = threading.BoundedSemaphore(ns.max_inflight)
        self._pool = cf.ThreadPoolExecutor(ns.max_inflight, thread_name_prefix="ckpt-write")
        self._partial: str | None = None  # object name of the last partial unit committed
        self._generation = 0
        self._dirty = True  # a file opened for writing and closed at once is an empty version
        self._aborted = False

    # -- io.RawIOBase
    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def write(self, data: ReadableBuffer) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        mv = memoryview(data).cast("B")
        n = len(mv)
        done = 0
        while done < n:
            take = min(self.unit_size - len(self._buf), n - done)
            self._buf += mv[done : done + take]
            done += take
            if len(self._buf) == self.unit_size:
                self._flush_unit()
        self.size += n
        self._dirty = self._dirty or n > 0
        return n

    def pwrite(self, offset: int, data: ReadableBuffer) -> int:
        """Write at ``offset``: at the end, past it (zero-filled), or inside the unit not
        yet uploaded. Anything earlier is refused: units already sent are immutable."""
        mv = memoryview(data).cast("B")
        if offset > self.size:
            self.write(bytes(offset - self.size))
        if offset == self.size:
            return self.write(mv)
        start = self.size - len(self._buf)
        if offset < start:
            raise CkptIOError(
                f"{self.name}: write at offset {offset} goes back before byte {start}, which is "
                "already uploaded: striped files are written front to back"
            )
        inside = min(len(mv), self.size - offset)
        self._buf[offset - start : offset - start + inside] = mv[:inside]
        self._dirty = True
        if inside < len(mv):
            self.write(mv[inside:])
        return len(mv)

    def flush(self) -> None:
        """Buffered bytes stay buffered until a unit is full: only :meth:`commit` publishes."""

    def commit(self) -> Manifest:
        """Publish what was written so far as the file's current version."""
        if self.closed or self._aborted:
            raise ValueError(f"{self.name}: commit after close or abort")
        if not self._dirty and self.committed is not None:
            return self.committed
        self._wait_all()
        units: list[tuple[str, str]] = [u for u in self._units if u is not None]
        partial = None
        if self._buf:
            self._generation += 1
            partial = f"{len(units)}.{self._generation}"
            self._upload(len(units), partial, bytes(self._buf))
            units.append((partial, unit_checksum(self._buf)))
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
        try:
            self.ns.commit(self.path, m)
        except (OSError, StoreError) as exc:
            raise CkptIOError(f"{self.name}: cannot write the manifest: {exc}") from None
        if previous is not None and previous.version != self.version:
            self.ns.delete_units(previous)
        if self._partial is not None and self._partial != partial:
            index = int(self._partial.split(".")[0])
            with contextlib.suppress(Exception):
                self.ns.store_for(self.targets[index % len(self.targets)]).delete(
                    self.ns.unit_key(self.version, self._partial)
                )
        self._partial = partial
        self.committed = m
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
            super().close()

    def abort(self) -> None:
        """Drop this version: the file keeps whatever version it had (or last committed)."""
        if not self.closed:
            self._abort()
            self._pool.shutdown(wait=True)
            super().close()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is not None:
            self.abort()
        else:
            self.close()

    # -- units
    def _flush_unit(self) -> None:
        index = len(self._units)
        data, self._buf = self._buf, bytearray()
        self._units.append(None)
        self._slots.acquire()
        try:
            fut = self._pool.submit(self._upload_full, index, data)
        except BaseException:
            self._slots.release()
            raise
        self._pending.add(fut)
        fut.add_done_callback(lambda _f: self._slots.release())
        # Surface a failed upload at the next write, not only at commit.
        for f in [f for f in self._pending if f.done()]:
            self._pending.discard(f)
            f.result()

    def _upload_full(self, index: int, data: bytearray) -> None:
        digest = unit_checksum(data)
        self._upload(index, str(index), data)
        self._units[index] = (str(index), digest)

    def _upload(self, index: int, name: str, data: bytes | bytearray) -> None:
        uri = self.targets[index % len(self.targets)]
        try:
            self.ns.store_for(uri).write_bytes(
                self.ns.unit_key(self.version, name), data, atomic=False
            )
        except (OSError, StoreError, CkptError) as exc:
            raise CkptIOError(
                f"{self.name}: cannot upload unit {index} to target {uri}: {exc}"
            ) from None

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
        if self.committed is None:  # nothing of this version is named: drop it all at once
            for store in self.ns.targets:
                with contextlib.suppress(Exception):
                    store.delete_prefix(f"{self.ns.name}/units/{self.version}")
            return
        # A committed manifest names some units of this version: delete only the others.
        keep = frozenset(u[0] for u in self.committed.units)
        names = [(i, str(i)) for i in range(len(self._units))]
        if self._partial is not None:
            names.append((int(self._partial.split(".")[0]), self._partial))
        for index, name in names:
            if name not in keep:
                with contextlib.suppress(Exception):
                    self.ns.store_for(self.targets[index % len(self.targets)]).delete(
                        self.ns.unit_key(self.version, name)
                    )
