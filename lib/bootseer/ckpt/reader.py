"""The parallel reader: one version of a striped file as a seekable, read-only file object.

Units are fetched whole (so each can be checked against its checksum) by a pool of
``max_inflight`` threads, and a reader moving forward has the next units on their way
from all K targets at once: :data:`FIRST_AHEAD` of them at first, twice as many each
time the reader catches up with one still on its way, up to ``read_ahead``. A reader
that stops short of the file's end (one rank's part of a sharded checkpoint) leaves
that window fetched and verified for nothing: on targets that keep ahead of it, two
units, not ``read_ahead``. At most ``read_ahead + 4`` units are held in memory per open
file (the read-ahead, the unit read and :data:`LATE` before it), and those that reads
in progress wait for (:meth:`StripedReader.pin`). A unit on a ``file://`` target is
read past the page cache (``O_DIRECT``) into a page-aligned buffer of the namespace's
(``Layout.buffers``, kept across the files it opens and writes), used again once the unit is
dropped and no view of it is left (:class:`bootseer.directio.Buffers`): no page-cache
fill, no copy out of it, no fresh pages to fault in. :meth:`StripedReader.pview` hands
out views of a unit's verified bytes (the FUSE daemon replies with them, without a copy).

    >>> import torch                                     # doctest: +SKIP
    >>> with ns.open("step100/model.pt") as f:           # doctest: +SKIP
    ...     state = torch.load(f)

:meth:`StripedReader.pread` is safe to call from several threads at once (the FUSE
mount serves concurrent reads of one open file through it).
"""

from __future__ import annotations

import concurrent.futures as cf
import io
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from bootseer import digest as digests
from bootseer.ckpt.errors import CkptError, CkptIOError
from bootseer.ckpt.manifest import Manifest
from bootseer.errors import StoreError

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

    from bootseer.ckpt.layout import Layout


# Units a read may come behind the last one read and still belong to the same sequential
# reader. The kernel sends a sequential reader's FUSE reads several at once, and a trace
# of one `cat` through the mount (4 MiB units, a 100 Mbit/s store link) had reads reach
# the daemon up to 3 units after later ones: taken for a seek back, each dropped the
# read-ahead (fetched again later), and each found its unit dropped (fetched again).
LATE = 3

# Units a reader moving forward has on their way at first. Where the targets keep ahead
# of the reader (local disk), it stays so; a slower target doubles it (up to
# ``read_ahead``) each time the reader has to wait for a unit fetched ahead.
FIRST_AHEAD = 2


class StripedReader(io.RawIOBase):
    def __init__(self, ns: Layout, path: str, manifest: Manifest) -> None:
        super().__init__()
        self.ns = ns
        self.path = path
        self.manifest = manifest
        self.name = f"{ns.name}:{path}"
        self._pos = 0
        self._lock = threading.Lock()
        self._units: OrderedDict[int, cf.Future[bytes | memoryview]] = OrderedDict()
        self._last = -1
        self._cap = max(ns.read_ahead, 0) + LATE + 1
        self._pins: dict[int, int] = {}  # unit -> reads in progress that need it
        # Units fetched ahead, so far: grows when the reader waits for one (_want).
        self._ahead = min(FIRST_AHEAD, max(ns.read_ahead, 0))
        # Units fetched ahead, not yet asked for -> the unit the reader was at then.
        self._fetched_ahead: dict[int, int] = {}
        workers = max(1, min(ns.max_inflight, manifest.unit_count))
        self._pool = cf.ThreadPoolExecutor(workers, thread_name_prefix="ckpt-read")
        self.fetched = 0  # bytes read from the targets, read-ahead included
        # The units' buffers, used again as units are dropped, and by the namespace's
        # next files (Layout.buffers).
        self._buffers = ns.buffers

    # -- io.RawIOBase
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    @property
    def size(self) -> int:
        return self.manifest.size

    def tell(self) -> int:
        self._check_open()
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._check_open()
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self.manifest.size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise OSError(22, f"negative seek position {pos}")
        self._pos = pos
        return pos

    def readinto(self, buffer: WriteableBuffer) -> int:
        self._check_open()
        out = memoryview(buffer).cast("B")
        n = self._copy(self._pos, out)
        self._pos += n
        return n

    def read(self, size: int | None = -1) -> bytes:
        self._check_open()
        if size is None or size < 0:
            return self.readall()
        data = self.pread(self._pos, size)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        self._check_open()
        data = self.pread(self._pos, max(0, self.manifest.size - self._pos))
        self._pos += len(data)
        return data

    def close(self) -> None:
        if not self.closed:
            self._pool.shutdown(wait=False, cancel_futures=True)
            with self._lock:
                for fut in self._units.values():
                    self._drop(fut)  # its buffer to the namespace's next file
                self._units.clear()
        super().close()

    # -- positional reads
    def pread(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``offset`` (fewer at the end of the file)."""
        n = max(0, min(offset + size, self.manifest.size) - offset)
        if n == 0:
            return b""
        u = self.manifest.unit_size
        index = offset // u
        if (offset + n - 1) // u == index:  # inside one unit: a single copy
            start = offset - index * u
            return bytes(self._unit(index)[start : start + n])
        out = bytearray(n)
        self._copy(offset, memoryview(out))
        return bytes(out)

    def pview(self, offset: int, size: int) -> memoryview:
        """Like :meth:`pread`, as a view: inside one unit, of the unit's verified bytes
        themselves (no copy; the FUSE daemon hands it to the kernel as it is)."""
        n = max(0, min(offset + size, self.manifest.size) - offset)
        u = self.manifest.unit_size
        index = offset // u
        if n and (offset + n - 1) // u == index:
            start = offset - index * u
            return memoryview(self._unit(index))[start : start + n]
        return memoryview(self.pread(offset, size))

    def pin(self, offset: int, size: int) -> range:
        """The units a read of ``size`` bytes at ``offset`` needs, asked for and held
        until :meth:`unpin`, whatever later reads drop meanwhile.

        The FUSE daemon pins a read's units as the read arrives. The kernel sends a
        sequential reader's reads several at once; one whose unit is still on its way
        waits for a thread while the next ones are served from units already here, and
        their read-ahead used to drop the unit it waited for (it was behind them): the
        read then fetched it again. With a 100 Mbit/s store link, 14 of 32 units were
        fetched twice (docs/performance.md, "One node warms too; each unit read once").
        """
        m = self.manifest
        n = max(0, min(offset + size, m.size) - offset)
        if n == 0:
            return range(0)
        indexes = range(offset // m.unit_size, (offset + n - 1) // m.unit_size + 1)
        with self._lock:
            for i in indexes:
                self._touch(i)
                self._pins[i] = self._pins.get(i, 0) + 1
        return indexes

    def unpin(self, indexes: range) -> None:
        with self._lock:
            for i in indexes:
                left = self._pins.get(i, 0) - 1
                if left > 0:
                    self._pins[i] = left
                else:
                    self._pins.pop(i, None)

    def pread_ready(self, offset: int, size: int) -> memoryview | None:
        """Like :meth:`pview` if the units it needs are in memory already, else None.

        It never waits, so an event loop (the FUSE daemon's) can call it directly and
        hand only the reads that must wait for a target to a thread. It asks for nothing
        and moves no read-ahead: :meth:`pin`, which the daemon calls as the read arrives,
        did both (:meth:`pview` does, for a reader that does not pin).
        """
        m = self.manifest
        n = max(0, min(offset + size, m.size) - offset)
        if n == 0:
            return memoryview(b"")
        indexes = range(offset // m.unit_size, (offset + n - 1) // m.unit_size + 1)
        with self._lock:
            futs = [self._units.get(i) for i in indexes]
            for f in futs:
                if f is None or not f.done() or f.cancelled() or f.exception() is not None:
                    return None
            for i in indexes:
                self._units.move_to_end(i)
        parts = [f.result() for f in futs if f is not None]
        start = offset - indexes[0] * m.unit_size
        if len(parts) == 1:
            return memoryview(parts[0])[start : start + n]
        out = bytearray(n)  # across units: one copy of the bytes asked for, no more
        done = 0
        for part in parts:
            take = min(len(part) - start, n - done)
            out[done : done + take] = memoryview(part)[start : start + take]
            done += take
            start = 0
        return memoryview(out)

    def _copy(self, offset: int, out: memoryview) -> int:
        m = self.manifest
        end = min(offset + len(out), m.size)
        done = 0
        while offset + done < end:
            at = offset + done
            index = at // m.unit_size
            data = self._unit(index)
            start = at - index * m.unit_size
            take = min(len(data) - start, end - at)
            out[done : done + take] = memoryview(data)[start : start + take]
            done += take
        return done

    # -- units
    def _unit(self, index: int) -> bytes | memoryview:
        while True:
            with self._lock:
                fut = self._touch(index)
            try:
                return fut.result()
            except cf.CancelledError:
                # Another thread's read-ahead evicted it before it started: ask again.
                if self.closed:
                    raise ValueError("I/O operation on closed file") from None
            except BaseException:
                with self._lock:
                    if self._units.get(index) is fut:
                        del self._units[index]  # a later read retries
                raise

    def _touch(self, index: int) -> cf.Future[bytes | memoryview]:
        """Unit ``index`` asked for by a read, and the read-ahead that follows from it
        (the lock held)."""
        held = index in self._units
        fut = self._want(index)
        self._read_ahead(index, held)
        return fut

    def _want(self, index: int) -> cf.Future[bytes | memoryview]:
        fut = self._units.get(index)
        if fut is None:
            fut = self._pool.submit(self._fetch, index)
            self._units[index] = fut
        elif index in self._fetched_ahead:
            # Fetched ahead with a lead of two units or more (not the next one of a run
            # just begun, which the kernel asks for with the first), yet not in time:
            # look further ahead.
            lead = index - self._fetched_ahead.pop(index)
            if lead >= 2 and not fut.done():
                self._ahead = min(max(1, 2 * self._ahead), self.ns.read_ahead)
        self._units.move_to_end(index)
        return fut

    def _read_ahead(self, index: int, held: bool) -> None:
        last = self._last
        if index < last and (held or last - index <= LATE):
            # A read that came after later ones (:data:`LATE`), or of a unit still held
            # (pinned by a read that waits): the reader has not gone back, so neither
            # does the read-ahead.
            return
        # Just past the last unit is "forward"; anything else is a seek.
        forward = last <= index <= last + 2
        self._last = index
        count = self.manifest.unit_count
        ahead = range(index + 1, min(index + 1 + self._ahead, count)) if forward else range(0)
        for j in ahead:
            if j not in self._units:
                self._units[j] = self._pool.submit(self._fetch, j)
                self._fetched_ahead[j] = index
        keep = set(ahead) | set(range(index - LATE, index + 1))
        for k in list(self._units):
            if len(self._units) <= self._cap:
                break
            if k not in keep and k not in self._pins:
                self._drop(self._units.pop(k))
                self._fetched_ahead.pop(k, None)

    def _drop(self, fut: cf.Future[bytes | memoryview]) -> None:
        """A unit no longer held: its buffer is read into again once nobody uses it."""
        if not fut.cancel() and fut.done() and fut.exception() is None:
            self._buffers.retire(fut.result())

    def _fetch(self, index: int) -> bytes | memoryview:
        m = self.manifest
        unit, digest = m.units[index]
        uri = m.target_of(index)
        key = self.ns.unit_key(m.version, unit)
        want = m.unit_length(index)
        if self.ns.via is not None:
            # Verified by digest on the way; a unit it cannot give comes from the target.
            got = self.ns.via(uri, key, 0, want, digest) if want else None
            if got is not None:
                data, source = got
                if source == "peer":
                    self.ns.peer_bytes += len(data)
                elif source == "store":
                    self.ns.store_bytes += len(data)
                self.fetched += len(data)
                return data
        try:
            store = self.ns.store_for(uri)
            # A file:// target is read past the page cache into the unit's own buffer.
            unit_data = store.read_direct(key, self._buffers)
        except FileNotFoundError:
            raise CkptIOError(
                f"{self.name}: unit {index} ({key}) is missing on target {uri}: the file was "
                "replaced or removed while being read, or the target lost data"
            ) from None
        except (StoreError, CkptError) as exc:
            raise CkptIOError(f"{self.name}: unit {index}: target {uri} failed: {exc}") from None
        if len(unit_data) != want:
            raise CkptIOError(
                f"{self.name}: unit {index} on target {uri} is damaged: {len(unit_data)} bytes, "
                f"the manifest says {want}"
            )
        if self.ns.verify and not digests.matches(unit_data, digest):
            self.ns.corrupt_units += 1
            raise CkptIOError(
                f"{self.name}: unit {index} on target {uri} is corrupt: its checksum does not "
                f"match the manifest (version {m.version}); run `bootseer ckpt verify`"
            )
        self.fetched += len(unit_data)
        self.ns.store_bytes += len(unit_data)
        return unit_data

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")

    def __getstate__(self) -> Any:
        raise TypeError("a StripedReader cannot be pickled")
