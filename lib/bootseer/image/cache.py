"""The node-local block cache: verified blocks by digest, under a size cap.

Layout: blocks are appended to a few large files, ``<cache_dir>/packs/<n>.pack`` (1 GiB
each, ``SEGMENT_BYTES``), each block at a 4 KiB-aligned offset (zero-padded to the next
one). Beside each pack, ``<n>.idx`` holds one 64-byte record per block (its digest,
offset and size, and the record's own CRC-32C; the record's magic says which hash the
digest is: ``BSP1`` SHA-256, ``BSB3`` BLAKE3), appended once the block's bytes are
written: an agent that restarts reads the records and finds its blocks. A file created
and renamed per 256 KiB block cost ext4 39% of the peer receiver's CPU
(docs/performance.md); a pack costs one write per block and one 64-byte append.

A block is put only after the caller checked its digest, so a block in the cache held
the right bytes once. Every read from the disk checks what it read again, so bytes
damaged on disk (a flipped bit, a bad sector, a stray write) are never served: the block
is dropped and fetched again. The check is a CRC-32C (the ``crc32c`` package: the
CPU's own instruction, 0.06 CPU-s per GiB here against zlib's CRC-32 at 0.28) of each
32 KiB piece of the block (``CHECK_CHUNK``), which the cache records in memory when it
writes the block: a read reads and checks the pieces it touches, not the whole block (a 128 KiB
FUSE request of a 256 KiB block used to read and check 256 KiB). Not the digest that
names it: SHA-256 ~8x slower here, BLAKE3 2x (docs/image.md has the figures), and the
cache (root's alone, 0700, its files 0600) guards against damage, not an adversary.
Blocks found on disk when the agent starts (a restart keeps the cache) have no CRCs
yet: their first read checks the digest of the whole block (SHA-256 or BLAKE3, as it
is named), then records them. What a crash half-wrote is never trusted: an index
record whose CRC fails (torn), or whose block lies past its pack's end (a pack shorter
than its index), is dropped; a block whose record survived but whose bytes did not
fails its digest on first read. An agent of a release before BLAKE3 reads ``BSB3``
records as none of its own: it drops them (and fetches those blocks again).

A restarted agent appends to a new pack, never to one it found. Eviction is
least-recently-used among blocks that no running job's image holds (those are *pinned*);
only when that is not enough does it take pinned blocks too, which a later read fetches
again. An evicted block's bytes are freed at once (``fallocate(PUNCH_HOLE)``: the pack
keeps its length, the disk blocks go; a restart sees the hole and skips the record), and
a pack with no block left is removed. Offsets are never used twice, so a reader that
raced an eviction (a peer's ``sendfile``, a descriptor handed on) reads zeros, never
another block's bytes, and its check fails. The cache of the layout before (a file per
block, ``<cache_dir>/blocks/``) is removed when the agent starts: its blocks are fetched
again as needed::

    >>> cache = BlockCache(Path("/tmp/doc-cache"), cap_bytes=1 << 30)
    >>> cache.put(digests.of(b"x"), b"x")
    >>> cache.read(digests.of(b"x"), 0, 1)
    b'x'
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import ctypes.util
import errno
import os
import re
import shutil
import struct
import threading
import uuid
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from bootseer import digest as digests
from bootseer.directio import DIRECT_ALIGN, pwritev_padded, room

CHECK_CHUNK = 32 << 10  # a CRC-32 per this many bytes of a block (the last piece: shorter)
SEGMENT_BYTES = 1 << 30  # a pack takes blocks until it is this long, then the next one
# The pack appended to is allocated this far ahead of its blocks (``fallocate``): ext4
# takes a file's lock exclusively for a direct write that extends it, shared for one into
# allocated space, so the fetch workers' writes no longer queue on each other.
AHEAD_BYTES = 16 << 20
# An index record: magic, the block's digest (32 bytes), its offset and size in the pack;
# then zeros up to the CRC-32C of the record's first 60 bytes, in its last 4. The magic
# names the digest's hash.
RECORD = struct.Struct("<4s32sQI")
RECORD_BYTES = 64
MAGICS: dict[digests.Algorithm, bytes] = {"sha256": b"BSP1", "blake3": b"BSB3"}
_ALGORITHM_OF = {magic: algorithm for algorithm, magic in MAGICS.items()}
_PACK_NAME = re.compile(r"(\d{8})\.(pack|idx)")
_OLD_LAYOUT = "blocks"  # the layout before: a file per block, <cache>/blocks/<aa>/<digest>


def chunk_crcs(data: bytes | bytearray | memoryview) -> array[int]:
    """The CRC-32 of each ``CHECK_CHUNK`` piece of a block."""
    view = memoryview(data)
    return array("I", (crc32c(view[i : i + CHECK_CHUNK]) for i in range(0, len(view), CHECK_CHUNK)))


def checked_crcs(data: memoryview, block_digest: str) -> array[int] | None:
    """The block's :func:`chunk_crcs` if its digest is ``block_digest``, else None: the
    CRCs taken right after the hash read the block, while its bytes are still in the
    CPU's cache (a second pass over a run's 8 MiB after all its hashes cost 0.1 CPU-s per
    GiB more here)."""
    if not digests.matches(data, block_digest):
        return None
    return chunk_crcs(data)


def crcs_match(crcs: Sequence[int], data: bytes | memoryview) -> bool:
    """Whether ``data``, a whole block, matches the block's piece CRCs
    (:meth:`BlockCache.open_held`'s, checked by the process that read the file)."""
    view = memoryview(data).cast("B")
    return len(crcs) == -(-len(view) // CHECK_CHUNK) and _pieces_ok(crcs, 0, (view,))


def _drop_pages(fd: int, offset: int, length: int) -> None:
    """Drop a block's range from the page cache (``POSIX_FADV_DONTNEED``). Blocks start
    4 KiB-aligned and are padded to the next 4 KiB, so the range's last partial page is
    the block's own: it goes too."""
    with contextlib.suppress(OSError):
        os.posix_fadvise(
            fd, offset, -(-length // DIRECT_ALIGN) * DIRECT_ALIGN, os.POSIX_FADV_DONTNEED
        )


def _pieces_ok(crcs: Sequence[int], lo: int, parts: tuple[memoryview, ...]) -> bool:
    """Whether ``parts``, laid end to end from ``lo`` (a piece's start) to a piece's end
    or the block's, match the block's piece CRCs."""
    index, crc, filled = lo // CHECK_CHUNK, 0, 0
    for part in parts:
        pos = 0
        while pos < len(part):
            take = min(CHECK_CHUNK - filled, len(part) - pos)
            crc = crc32c(part[pos : pos + take], crc)
            filled += take
            pos += take
            if filled == CHECK_CHUNK:
                if crc != crcs[index]:
                    return False
                index, crc, filled = index + 1, 0, 0
    return filled == 0 or crc == crcs[index]


def index_record(block_digest: str, offset: int, size: int) -> bytes:
    algorithm, hex_digits = digests.split(block_digest)
    head = RECORD.pack(MAGICS[algorithm], bytes.fromhex(hex_digits), offset, size)
    head += bytes(RECORD_BYTES - 4 - len(head))
    return head + crc32c(head).to_bytes(4, "little")


def parse_record(rec: bytes) -> tuple[str, int, int] | None:
    """(digest, offset, size) of a whole index record, None if it is torn or not one."""
    if len(rec) != RECORD_BYTES or crc32c(rec[:-4]) != int.from_bytes(rec[-4:], "little"):
        return None
    magic, raw, offset, size = RECORD.unpack_from(rec)
    algorithm = _ALGORITHM_OF.get(magic)
    return (digests.join(algorithm, raw.hex()), offset, size) if algorithm else None


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 0x01, 0x02


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Free the disk blocks of ``length`` bytes at ``offset`` (they read as zeros after)."""
    if _libc.fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length):
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def allocate(fd: int, offset: int, length: int) -> bool:
    """Allocate ``length`` bytes at ``offset`` (the file grows to cover them; they read
    as zeros): whether the filesystem did (no zeros written where it cannot)."""
    return bool(_libc.fallocate(fd, 0, offset, length) == 0)


def _is_hole(fd: int, offset: int) -> bool:
    """Whether the pack's bytes at ``offset`` were freed (a punched block starts a hole)."""
    try:
        return os.lseek(fd, offset, os.SEEK_DATA) != offset
    except OSError as exc:
        # ENXIO: no data past it; anything else: no SEEK_DATA here, everything is data.
        return exc.errno == errno.ENXIO


@dataclass(frozen=True)
class Where:
    """Where a cached block's bytes lie: ``size`` bytes at ``offset`` of the pack at
    ``path`` (4 KiB-aligned, zero-padded past ``size`` to the next 4 KiB)."""

    path: Path
    offset: int
    size: int


def blocks_on_disk(root: Path) -> dict[str, Where]:
    """The blocks a cache at ``root`` holds on disk by its packs' indexes (whole records
    within their pack, not punched out), read from outside the agent that owns it (a
    test, an admin's look): nothing is checked against its digest."""
    held: dict[str, Where] = {}
    for idx in sorted((root / "packs").glob("*.idx")):
        pack = idx.with_suffix(".pack")
        try:
            fd = os.open(pack, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            size = os.fstat(fd).st_size
            raw = idx.read_bytes()
            for at in range(0, len(raw) - RECORD_BYTES + 1, RECORD_BYTES):
                rec = parse_record(raw[at : at + RECORD_BYTES])
                if rec is not None and rec[1] + rec[2] <= size and not _is_hole(fd, rec[1]):
                    held.setdefault(rec[0], Where(pack, rec[1], rec[2]))
        finally:
            os.close(fd)
    return held


class _Pack:
    """One pack file and its index, open."""

    def __init__(self, number: int, path: Path, fd: int) -> None:
        self.number = number
        self.path = path
        self.index_path = path.with_suffix(".idx")
        self.fd = fd  # read-write: reads, holes punched
        # A pack's blocks lie in the order they came, not a reader's: the kernel's own
        # read-ahead would read a neighbour's bytes, in large pages that span blocks. A
        # read reads its range alone (readers that know what comes next say so:
        # :meth:`BlockCache.advise`), so that the pages of a range can be dropped again.
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        self.direct_fd = -1  # the pack appended to: writes past the page cache (or ``fd``)
        self.index_fd = -1  # the pack appended to: its index, O_APPEND
        self.end = 0  # where the next block goes
        self.allocated = 0  # allocated ahead up to here (AHEAD_BYTES)
        self.current = False  # blocks are being appended to it
        self.live = 0  # blocks held, being written or being freed
        self.writing = 0  # blocks being written
        self.users = 0  # reads of ``fd`` under way
        self.removed = False

    def close_writers(self) -> None:
        for fd in (self.direct_fd, self.index_fd):
            if fd >= 0 and fd != self.fd:
                os.close(fd)
        self.direct_fd = self.index_fd = -1

    def __del__(self) -> None:  # a cache dropped without close(): its files with it
        if not self.removed:
            self.removed = True
            self.close_writers()
            os.close(self.fd)


@dataclass(slots=True)
class _Entry:
    pack: _Pack
    offset: int
    size: int
    crcs: array[int] | None  # chunk_crcs of the block, once written or checked by this process


class BlockCache:
    def __init__(
        self,
        root: Path,
        cap_bytes: int,
        log: Callable[[str], None] = lambda _: None,
        segment_bytes: int = SEGMENT_BYTES,
    ) -> None:
        self.root = root
        self.cap = cap_bytes
        self.log = log
        self.segment_bytes = segment_bytes
        # Allocated ahead: at most an eighth of the cap (a small cache's disk stays near it).
        self.ahead = min(AHEAD_BYTES, cap_bytes // 8 // DIRECT_ALIGN * DIRECT_ALIGN)
        self._lock = threading.Lock()
        self._lru: collections.OrderedDict[str, _Entry] = collections.OrderedDict()
        self._pins: collections.Counter[str] = collections.Counter()
        self._current: _Pack | None = None
        self._next = 1
        self.bytes = 0
        self.evicted = 0
        self.dropped_bad = 0
        self.dropped_records = 0  # index records found torn, or past their pack's end
        self.unwritten = 0  # verified blocks the disk would not take (served all the same)
        self.packs = root / "packs"
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.packs.mkdir(exist_ok=True, mode=0o700)
        # The layout before, removed by a thread of its own (a full cache of it is
        # hundreds of thousands of files): ``old_layout_removed`` joins it.
        self.sweeper: threading.Thread | None = None
        self._drop_old_layout()
        self._scan()

    # -- start: the packs found, the layout before ------------------------------------

    def _drop_old_layout(self) -> None:
        old = self.root / _OLD_LAYOUT
        if old.is_dir():
            # Renamed first: a restart mid-removal finds it gone from ``blocks``.
            old.rename(self.root / f"{_OLD_LAYOUT}.removing-{uuid.uuid4().hex[:8]}")
            self.log(
                f"cache {self.root}: the block files of the layout before (a file per "
                "block) are being removed; their blocks are fetched again as needed"
            )
        doomed = list(self.root.glob(f"{_OLD_LAYOUT}.removing-*"))
        if doomed:

            def sweep() -> None:
                for d in doomed:
                    shutil.rmtree(d, ignore_errors=True)

            self.sweeper = threading.Thread(target=sweep, name="cache-old-layout", daemon=True)
            self.sweeper.start()

    def old_layout_removed(self, timeout: float | None = None) -> bool:
        if self.sweeper is not None:
            self.sweeper.join(timeout)
            return not self.sweeper.is_alive()
        return True

    def _scan(self) -> None:
        found: dict[int, set[str]] = collections.defaultdict(set)
        for f in self.packs.iterdir():
            m = _PACK_NAME.fullmatch(f.name)
            if m is None:
                f.unlink(missing_ok=True)  # not the cache's
            else:
                found[int(m[1])].add(m[2])
        for number in sorted(found):
            pack_path = self.packs / f"{number:08d}.pack"
            if found[number] != {"pack", "idx"}:  # one of the two never made, or left
                pack_path.unlink(missing_ok=True)
                pack_path.with_suffix(".idx").unlink(missing_ok=True)
                continue
            self._load(number, pack_path)
        self._next = max(found, default=0) + 1
        if self._lru:
            self.log(
                f"cache {self.root}: {len(self._lru)} blocks, {self.bytes} bytes kept from "
                "before; each is checked on first read"
            )
        if self.dropped_records:
            self.log(
                f"cache {self.root}: {self.dropped_records} index records torn or past "
                "their pack's end (a crash mid-write): those blocks dropped"
            )

    def _load(self, number: int, pack_path: Path) -> None:
        fd = os.open(pack_path, os.O_RDWR | os.O_CLOEXEC)
        pack = _Pack(number, pack_path, fd)
        size = os.fstat(fd).st_size
        pack.end = size
        raw = pack.index_path.read_bytes()
        whole = len(raw) - len(raw) % RECORD_BYTES
        self.dropped_records += len(raw) > whole  # a record the crash cut short
        last = 0
        for at in range(0, whole, RECORD_BYTES):
            rec = parse_record(raw[at : at + RECORD_BYTES])
            if rec is None or rec[1] % DIRECT_ALIGN or rec[1] + rec[2] > size:
                self.dropped_records += 1
                continue
            block_digest, offset, length = rec
            last = max(last, offset + room(length))
            if block_digest in self._lru:  # written twice (puts that raced): one is enough
                self._punch(pack, offset, length)
                continue
            if _is_hole(fd, offset):  # evicted before
                continue
            self._lru[block_digest] = _Entry(pack, offset, length, crcs=None)
            self.bytes += length
            pack.live += 1
        if size > last and pack.live:  # allocated ahead, or bytes no record names
            with contextlib.suppress(OSError):
                os.ftruncate(fd, last)
        self._maybe_remove(pack)

    # -- lookups -----------------------------------------------------------------------

    def __contains__(self, block_digest: str) -> bool:
        with self._lock:
            return block_digest in self._lru

    def __len__(self) -> int:
        return len(self._lru)

    def locate(self, block_digest: str) -> Where | None:
        """Where the block's bytes lie, if it is here (for a reader that checks them: a
        peer's sendfile, whose receiver checks the digest)."""
        with self._lock:
            entry = self._lru.get(block_digest)
            if entry is None:
                return None
            return Where(entry.pack.path, entry.offset, entry.size)

    def _use(self, block_digest: str, touch: bool = True) -> _Entry | None:
        """The block's entry, its pack held open until :meth:`_done` (caller: no lock)."""
        with self._lock:
            entry = self._lru.get(block_digest)
            if entry is None:
                return None
            if touch:
                self._lru.move_to_end(block_digest)
            entry.pack.users += 1
            return entry

    def _done(self, pack: _Pack) -> None:
        with self._lock:
            pack.users -= 1
            self._maybe_remove(pack)

    # -- reads -------------------------------------------------------------------------

    def read(self, block_digest: str, offset: int, length: int, drop: bool = False) -> bytes | None:
        """``length`` bytes at ``offset`` of a cached block, or None if it is not here
        (``drop``: as :meth:`read_into`'s)."""
        with self._lock:
            entry = self._lru.get(block_digest)
            if entry is None:
                return None
            length = max(0, min(length, entry.size - offset))
        buf = bytearray(length)
        return bytes(buf) if self.read_into(block_digest, offset, memoryview(buf), drop) else None

    def read_into(
        self, block_digest: str, offset: int, out: memoryview, drop: bool = False
    ) -> bool:
        """Fill ``out`` with the cached block's bytes at ``offset``; False (``out`` left
        in any state) if the block is not here, or was damaged on disk (then dropped).

        Reads the ``CHECK_CHUNK`` pieces the range touches, straight into ``out`` (the
        parts of the first and last pieces outside it into scratch buffers: one
        ``preadv``), and checks each piece's CRC before returning. With ``drop``, the
        pages read leave the page cache again (the caller keeps the bytes: the agent's
        FUSE reply goes into the job file's own page cache, so the node holds them once).
        """
        entry = self._use(block_digest)
        if entry is None:
            return False
        try:
            size = entry.size
            end = offset + len(out)
            if offset < 0 or end > size:
                raise ValueError(f"bytes {offset}-{end} of a block of {size}")
            if entry.crcs is None:
                whole = self._verify(block_digest, entry)
                if whole is None:
                    return False
                out[:] = whole[offset:end]
                if drop:
                    _drop_pages(entry.pack.fd, entry.offset, size)
                return True
            lo = offset - offset % CHECK_CHUNK
            hi = min(size, -(-end // CHECK_CHUNK) * CHECK_CHUNK)
            head = memoryview(bytearray(offset - lo))
            tail = memoryview(bytearray(hi - end))
            got = os.preadv(entry.pack.fd, [head, out, tail], entry.offset + lo)
            # A pack cut short (a crash, a stray truncate) is damage too.
            if got != hi - lo or not _pieces_ok(entry.crcs, lo, (head, out, tail)):
                self._bad(block_digest, entry)
                return False
            if drop:
                _drop_pages(entry.pack.fd, entry.offset + lo, hi - lo)
            return True
        finally:
            self._done(entry.pack)

    def open_held(self, block_digest: str) -> tuple[int, Where, array[int]] | None:
        """The cached block's pack opened for reading (past the page cache where the
        filesystem allows), where the block lies in it, and its piece CRCs: for another
        of root's processes, which reads the block and checks it (:func:`crcs_match`), so
        that this one reads nothing. None if the block is not here, or has no CRCs yet
        (kept from before a restart: :meth:`read` checks its digest and records them).
        The caller closes the file."""
        with self._lock:
            entry = self._lru.get(block_digest)
            if entry is None or entry.crcs is None:
                return None
            self._lru.move_to_end(block_digest)
            crcs, where = entry.crcs, Where(entry.pack.path, entry.offset, entry.size)
        try:
            try:
                fd = os.open(where.path, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECT)
            except OSError as exc:
                if exc.errno != errno.EINVAL:  # no O_DIRECT here (tmpfs)
                    raise
                fd = os.open(where.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # its pack emptied and removed meanwhile
            return None
        return fd, where, crcs

    def advise(self, digests: Iterable[str]) -> None:
        """Ask the kernel to start reading these cached blocks from the disk
        (``POSIX_FADV_WILLNEED``: it returns at once). A job's blocks lie in its packs in
        the order they came, not the image's: a reader that knows what comes next says
        so here, and its later reads find the pages in memory."""
        for d in digests:
            entry = self._use(d, touch=False)
            if entry is None:
                continue  # not here (any more): nothing to read ahead
            try:
                os.posix_fadvise(entry.pack.fd, entry.offset, entry.size, os.POSIX_FADV_WILLNEED)
            finally:
                self._done(entry.pack)

    def _verify(self, block_digest: str, entry: _Entry) -> bytes | None:
        data = os.pread(entry.pack.fd, entry.size, entry.offset)
        if len(data) != entry.size or not digests.matches(data, block_digest):
            self._bad(block_digest, entry)
            return None
        with self._lock:
            entry.crcs = chunk_crcs(data)
        return data

    def _bad(self, block_digest: str, entry: _Entry) -> None:
        with self._lock:
            if self._lru.get(block_digest) is not entry:
                return  # evicted while it was read (its hole reads as zeros): no damage
            del self._lru[block_digest]
            self.bytes -= entry.size
            self.dropped_bad += 1
        self.log(f"cache: block {block_digest[:12]} damaged on disk; dropped, fetched again")
        self._free(entry.pack, entry.offset, entry.size)

    # -- writes ------------------------------------------------------------------------

    def put(self, block_digest: str, data: bytes | memoryview) -> None:
        """Add a block whose digest the caller has checked (nothing, with a log line,
        where the disk will not take it)."""
        self.put_many([(block_digest, data, None)])

    def put_many(self, blocks: Sequence[tuple[str, bytes | memoryview, array[int] | None]]) -> None:
        """Add blocks whose digests the caller has checked (a run of them), each with its
        :func:`chunk_crcs` if the caller took them (:func:`checked_crcs`; None: taken
        here): laid end to end in the pack, their bytes in one write (from where they
        are when they lie on whole pages, a run received into an aligned buffer: no
        copy), then their index records in one append. A block already here, or twice
        in ``blocks``, is put once; where the disk will not take them, nothing is (with
        a log line)."""
        new: dict[str, memoryview] = {}
        given: dict[str, array[int] | None] = {}
        with self._lock:
            for d, data, c in blocks:
                if d not in self._lru and d not in new:
                    new[d] = memoryview(data).cast("B")
                    given[d] = c
            if not new:
                return
            need = sum(room(len(v)) for v in new.values())
            try:
                pack = self._pack_for(need)
            except OSError as exc:
                pack = None
                failure = exc
            if pack is not None:
                start = pack.end
                pack.end += need
                pack.live += len(new)
                pack.writing += 1
                if pack.end > pack.allocated:
                    want = min(self.segment_bytes, pack.end + self.ahead)
                    if want > pack.allocated and allocate(
                        pack.fd, pack.allocated, want - pack.allocated
                    ):
                        pack.allocated = want
                    else:
                        pack.allocated = pack.end  # a full disk, no fallocate: as it comes
        if pack is None:
            for _ in new:
                self._unwritten(failure)
            return
        placed: list[tuple[str, int, int]] = []  # digest, offset, size
        at = start
        for d, v in new.items():
            placed.append((d, at, len(v)))
            at += room(len(v))
        try:
            # Past the page cache: a piece is read once, by the daemon that asked for it
            # or a peer's sendfile, and fresh page-cache pages cost this VM more than the
            # disk's read does (docs/p2p.md, "Per byte").
            pwritev_padded(pack.direct_fd, list(new.values()), start)
            # The records after the bytes they name: a crash between the two leaves
            # bytes no record names, never a record of bytes not written.
            records = b"".join(index_record(d, off, size) for d, off, size in placed)
            if os.write(pack.index_fd, records) != len(records):
                with self._lock:
                    self._retire(pack)  # a torn record: appended to no more
                raise OSError(errno.ENOSPC, "the index took part of a record")
        except OSError as exc:
            # A full disk (a user's staged checkpoint bytes share it by default) costs
            # the cache, never the read: the caller serves the verified block uncached.
            self._wrote(pack)
            for _, off, size in placed:
                self._free(pack, off, size)
                self._unwritten(exc)
            return
        crcs = [given[d] if given[d] is not None else chunk_crcs(v) for d, v in new.items()]
        self._wrote(pack)
        twice: list[tuple[str, int, int]] = []
        victims: list[_Entry] = []
        with self._lock:
            for (d, off, size), c in zip(placed, crcs, strict=True):
                if d in self._lru:  # another put of it won: its record is found first
                    twice.append((d, off, size))  # after a restart
                    continue
                self._lru[d] = _Entry(pack, off, size, c)
                self.bytes += size
            if len(twice) < len(placed):
                victims = self._victims()
        for _, off, size in twice:
            self._free(pack, off, size)
        for e in victims:
            self._free(e.pack, e.offset, e.size)

    def _unwritten(self, exc: OSError) -> None:
        with self._lock:
            self.unwritten += 1
            n = self.unwritten
        if n == 1 or n % 10_000 == 0:
            self.log(
                f"cache: cannot write a block ({exc.strerror or exc}); {n} served uncached so far"
            )

    def _pack_for(self, need: int) -> _Pack:
        """The pack the next ``need`` bytes of blocks (padded) go to (caller holds the
        lock): the current one, or a new one when they do not fit."""
        cur = self._current
        if cur is not None and (cur.end == 0 or cur.end + need <= self.segment_bytes):
            return cur
        if cur is not None:
            self._retire(cur)
        number = self._next
        self._next += 1
        path = self.packs / f"{number:08d}.pack"
        opened: list[int] = []
        try:
            flags = os.O_CLOEXEC | os.O_CREAT | os.O_EXCL
            opened.append(os.open(path, os.O_RDWR | flags, 0o600))
            index = path.with_suffix(".idx")
            opened.append(os.open(index, os.O_WRONLY | os.O_APPEND | flags, 0o600))
            try:
                opened.append(os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_DIRECT))
            except OSError as exc:
                if exc.errno != errno.EINVAL:  # no O_DIRECT here (tmpfs)
                    raise
                opened.append(opened[0])
        except OSError:
            for fd in dict.fromkeys(opened):
                os.close(fd)
            path.unlink(missing_ok=True)
            path.with_suffix(".idx").unlink(missing_ok=True)
            raise
        pack = _Pack(number, path, opened[0])
        pack.index_fd, pack.direct_fd = opened[1], opened[2]
        pack.current = True
        self._current = pack
        return pack

    def _retire(self, pack: _Pack) -> None:
        """No more blocks go to ``pack`` (caller holds the lock)."""
        if self._current is pack:
            self._current = None
        pack.current = False
        if pack.allocated > pack.end:  # what was allocated ahead, given back
            with contextlib.suppress(OSError):
                os.ftruncate(pack.fd, pack.end)
        if pack.writing == 0:
            pack.close_writers()
        self._maybe_remove(pack)

    def _wrote(self, pack: _Pack) -> None:
        with self._lock:
            pack.writing -= 1
            if not pack.current and pack.writing == 0:
                pack.close_writers()

    def _free(self, pack: _Pack, offset: int, size: int) -> None:
        """A block's bytes are no longer the cache's: free them, and the pack once empty
        (the block counts in ``pack.live`` until then, so the pack stays open)."""
        self._punch(pack, offset, size)
        with self._lock:
            pack.live -= 1
            self._maybe_remove(pack)

    def _punch(self, pack: _Pack, offset: int, size: int) -> None:
        try:
            punch_hole(pack.fd, offset, room(size))
        except OSError as exc:
            # No hole punching on this filesystem: the bytes go with their pack.
            self.log(f"cache: cannot free a block's bytes in {pack.path} ({exc.strerror})")

    def _maybe_remove(self, pack: _Pack) -> None:
        """Remove the pack once nothing is in it, reads it or appends to it (caller holds
        the lock, or is starting)."""
        if pack.live or pack.users or pack.writing or pack.current or pack.removed:
            return
        pack.removed = True
        pack.close_writers()
        os.close(pack.fd)
        pack.path.unlink(missing_ok=True)
        pack.index_path.unlink(missing_ok=True)

    def _victims(self) -> list[_Entry]:
        """Pick blocks to evict and take them out (caller holds the lock): unpinned LRU
        first, then pinned; the caller frees their bytes.

        Walks from the oldest block and stops once enough is freed: a full cache holds
        hundreds of thousands of blocks, and every put may come here.
        """
        need = self.bytes - self.cap
        if need <= 0:
            return []
        newest = next(reversed(self._lru))  # never the block just added
        victims: list[str] = []
        for pinned_pass in (False, True):
            for d, entry in self._lru.items():
                if need <= 0:
                    break
                if d != newest and bool(self._pins[d]) == pinned_pass:
                    victims.append(d)
                    need -= entry.size
        if any(self._pins[d] for d in victims):
            self.log(
                "cache over its cap with blocks of running jobs' images: evicted "
                f"some of those too (cap {self.cap} bytes)"
            )
        taken = [self._lru.pop(d) for d in victims]
        self.bytes -= sum(e.size for e in taken)
        self.evicted += len(taken)
        return taken

    def pin(self, digests: Iterable[str]) -> None:
        with self._lock:
            self._pins.update(digests)

    def unpin(self, digests: Iterable[str]) -> None:
        with self._lock:
            self._pins.subtract(digests)
            self._pins = +self._pins  # drop zero counts

    def close(self) -> None:
        """Close the packs' files (the cache is not used after)."""
        with self._lock:
            packs = {id(e.pack): e.pack for e in self._lru.values()}
            if self._current is not None:
                packs[id(self._current)] = self._current
            for p in packs.values():
                if not p.removed:
                    p.removed = True
                    p.close_writers()
                    os.close(p.fd)
            self._lru.clear()
            self._current = None
