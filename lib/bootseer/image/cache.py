"""The node-local block cache: verified blocks by digest, under a size cap.

Layout: ``<cache_dir>/blocks/<aa>/<digest>``. A block is written to a temporary name
and renamed into place only after its digest checked, so a name in the cache always
held the right bytes. Every read from the disk checks what it read again, so bytes
damaged on disk (a flipped bit, a bad sector, a stray write) are never served: the block
is dropped and fetched again. The check is a CRC-32C (the ``crc32c`` package: the
CPU's own instruction, 0.06 CPU-s per GiB here against zlib's CRC-32 at 0.28) of each
32 KiB piece of the block (``CHECK_CHUNK``), which the cache records in memory when it
writes the block: a read reads and checks the pieces it touches, not the whole block (a 128 KiB
FUSE request of a 256 KiB block used to read and check 256 KiB). Not the SHA-256 that
names it: ~8x slower here (docs/image.md has the figures), and the cache (root's alone,
0700) guards against damage, not an adversary. Blocks found on disk when the agent
starts (a restart keeps the cache) have no CRCs yet: their first read checks the
SHA-256 of the whole block, then records them.

Eviction is least-recently-used among blocks that no running job's image holds
(those are *pinned*); only when that is not enough does it take pinned blocks too,
which a later read fetches again::

    >>> cache = BlockCache(Path("/tmp/doc-cache"), cap_bytes=1 << 30)
    >>> cache.put(digest(b"x"), b"x")
    >>> cache.read(digest(b"x"), 0, 1)
    b'x'
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import threading
import uuid
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from bootseer.directio import write_all
from bootseer.image.blocks import DIGEST, digest

CHECK_CHUNK = 32 << 10  # a CRC-32 per this many bytes of a block (the last piece: shorter)


def chunk_crcs(data: bytes | bytearray | memoryview) -> array[int]:
    """The CRC-32 of each ``CHECK_CHUNK`` piece of a block."""
    view = memoryview(data)
    return array("I", (crc32c(view[i : i + CHECK_CHUNK]) for i in range(0, len(view), CHECK_CHUNK)))


def crcs_match(crcs: Sequence[int], data: bytes | memoryview) -> bool:
    """Whether ``data``, a whole block, matches the block's piece CRCs
    (:meth:`BlockCache.open_held`'s, checked by the process that read the file)."""
    view = memoryview(data).cast("B")
    return len(crcs) == -(-len(view) // CHECK_CHUNK) and _pieces_ok(crcs, 0, (view,))


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


@dataclass
class _Entry:
    size: int
    crcs: array[int] | None  # chunk_crcs of the block, once written or checked by this process


class BlockCache:
    def __init__(
        self, root: Path, cap_bytes: int, log: Callable[[str], None] = lambda _: None
    ) -> None:
        self.root = root
        self.cap = cap_bytes
        self.log = log
        self._lock = threading.Lock()
        self._lru: collections.OrderedDict[str, _Entry] = collections.OrderedDict()
        self._pins: collections.Counter[str] = collections.Counter()
        self.bytes = 0
        self.evicted = 0
        self.dropped_bad = 0
        self.unwritten = 0  # verified blocks the disk would not take (served all the same)
        (root / "blocks").mkdir(parents=True, exist_ok=True, mode=0o700)
        self._scan()

    def _scan(self) -> None:
        found = []
        for sub in (self.root / "blocks").iterdir():
            if not sub.is_dir():
                continue
            for f in sub.iterdir():
                if not DIGEST.match(f.name) or f.name[:2] != sub.name:
                    f.unlink(missing_ok=True)  # a temporary file left by a crash
                    continue
                st = f.stat()
                found.append((st.st_mtime_ns, f.name, st.st_size))
        for _, name, size in sorted(found):
            self._lru[name] = _Entry(size, crcs=None)
            self.bytes += size
        if found:
            self.log(
                f"cache {self.root}: {len(found)} blocks, {self.bytes} bytes kept from "
                "before; each is checked on first read"
            )

    def path(self, block_digest: str) -> Path:
        return self.root / "blocks" / block_digest[:2] / block_digest

    def __contains__(self, block_digest: str) -> bool:
        with self._lock:
            return block_digest in self._lru

    def __len__(self) -> int:
        return len(self._lru)

    def read(self, block_digest: str, offset: int, length: int) -> bytes | None:
        """``length`` bytes at ``offset`` of a cached block, or None if it is not here."""
        with self._lock:
            entry = self._lru.get(block_digest)
            if entry is None:
                return None
            length = max(0, min(length, entry.size - offset))
        buf = bytearray(length)
        return bytes(buf) if self.read_into(block_digest, offset, memoryview(buf)) else None

    def read_into(self, block_digest: str, offset: int, out: memoryview) -> bool:
        """Fill ``out`` with the cached block's bytes at ``offset``; False (``out`` left
        in any state) if the block is not here, or was damaged on disk (then dropped).

        Reads the ``CHECK_CHUNK`` pieces the range touches, straight into ``out`` (the
        parts of the first and last pieces outside it into scratch buffers: one
        ``preadv``), and checks each piece's CRC before returning.
        """
        with self._lock:
            entry = self._lru.get(block_digest)
            if entry is None:
                return False
            self._lru.move_to_end(block_digest)
            crcs, size = entry.crcs, entry.size
        end = offset + len(out)
        if offset < 0 or end > size:
            raise ValueError(f"bytes {offset}-{end} of a block of {size}")
        if crcs is None:
            whole = self._verify(block_digest)
            if whole is None:
                return False
            out[:] = whole[offset:end]
            return True
        lo = offset - offset % CHECK_CHUNK
        hi = min(size, -(-end // CHECK_CHUNK) * CHECK_CHUNK)
        head = memoryview(bytearray(offset - lo))
        tail = memoryview(bytearray(hi - end + 1))  # one byte more: a longer file shows
        try:
            fd = os.open(self.path(block_digest), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # evicted meanwhile
            self._forget(block_digest)
            return False
        try:
            got = os.preadv(fd, [head, out, tail], lo)
        finally:
            os.close(fd)
        # Exactly the block's length on disk: the byte past ``hi`` is there unless ``hi``
        # is the end (a shorter or longer file is damage too).
        if got != hi - lo + (hi < size) or not _pieces_ok(crcs, lo, (head, out, tail[: hi - end])):
            self._bad(block_digest)
            return False
        return True

    def open_held(self, block_digest: str) -> tuple[int, array[int]] | None:
        """The cached block's file opened for reading (past the page cache where the
        filesystem allows) and its piece CRCs: for another of root's processes, which
        reads the file and checks it (:func:`crcs_match`), so that this one reads nothing.
        None if the block is not here, or has no CRCs yet (kept from before a restart:
        :meth:`read` checks its SHA-256 and records them). The caller closes the file."""
        with self._lock:
            entry = self._lru.get(block_digest)
            if entry is None or entry.crcs is None:
                return None
            self._lru.move_to_end(block_digest)
            crcs = entry.crcs
        path = self.path(block_digest)
        try:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECT)
            except OSError as exc:
                if exc.errno != errno.EINVAL:  # no O_DIRECT here (tmpfs)
                    raise
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # evicted meanwhile
            self._forget(block_digest)
            return None
        return fd, crcs

    def advise(self, digests: Iterable[str]) -> None:
        """Ask the kernel to start reading these cached blocks' files from the disk
        (``POSIX_FADV_WILLNEED``: it returns at once). Each block is its own file, so
        the disk's read-ahead never runs past one block: a reader that knows what comes
        next says so here, and its later reads find the pages in memory."""
        for d in digests:
            try:
                fd = os.open(self.path(d), os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue  # not here (any more): nothing to read ahead
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)

    def _verify(self, block_digest: str) -> bytes | None:
        try:
            data = self.path(block_digest).read_bytes()
        except FileNotFoundError:
            self._forget(block_digest)
            return None
        if digest(data) != block_digest:
            self._bad(block_digest)
            return None
        with self._lock:
            entry = self._lru.get(block_digest)
            if entry is not None:
                entry.crcs = chunk_crcs(data)
        return data

    def _bad(self, block_digest: str) -> None:
        self.log(f"cache: block {block_digest[:12]} damaged on disk; dropped, fetched again")
        self.dropped_bad += 1
        self._drop(block_digest)

    def put(self, block_digest: str, data: bytes | memoryview) -> None:
        """Add a block whose digest the caller has checked (nothing, with a log line,
        where the disk will not take it)."""
        final = self.path(block_digest)
        with self._lock:
            if block_digest in self._lru:
                return
        tmp = final.parent / f".tmp-{uuid.uuid4().hex[:8]}"
        try:
            final.parent.mkdir(exist_ok=True, mode=0o700)
            # Past the page cache: a piece is read once, by the daemon that asked for it
            # or a peer's sendfile, and fresh page-cache pages cost this VM more than the
            # disk's read does (docs/p2p.md, "Per byte").
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                write_all(fd, data, direct=True)
            finally:
                os.close(fd)
            os.replace(tmp, final)
        except OSError as exc:
            # A full disk (a user's staged checkpoint bytes share it by default) costs
            # the cache, never the read: the caller serves the verified block uncached.
            tmp.unlink(missing_ok=True)
            self.unwritten += 1
            if self.unwritten == 1 or self.unwritten % 10_000 == 0:
                self.log(
                    f"cache: cannot write a block ({exc.strerror or exc}); "
                    f"{self.unwritten} served uncached so far"
                )
            return
        with self._lock:
            if block_digest not in self._lru:
                self._lru[block_digest] = _Entry(len(data), crcs=chunk_crcs(data))
                self.bytes += len(data)
            victims = self._victims()
        for v in victims:
            self.path(v).unlink(missing_ok=True)

    def _victims(self) -> list[str]:
        """Pick blocks to evict (caller holds the lock): unpinned LRU first, then pinned.

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
        for d in victims:
            self.bytes -= self._lru.pop(d).size
        self.evicted += len(victims)
        return victims

    def _forget(self, block_digest: str) -> None:
        with self._lock:
            entry = self._lru.pop(block_digest, None)
            if entry is not None:
                self.bytes -= entry.size

    def _drop(self, block_digest: str) -> None:
        self._forget(block_digest)
        with contextlib.suppress(FileNotFoundError):
            self.path(block_digest).unlink()

    def pin(self, digests: Iterable[str]) -> None:
        with self._lock:
            self._pins.update(digests)

    def unpin(self, digests: Iterable[str]) -> None:
        with self._lock:
            self._pins.subtract(digests)
            self._pins = +self._pins  # drop zero counts
