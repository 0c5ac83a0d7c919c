"""The cached read path: piece-wise checks of a block's bytes, reads across blocks, into
one buffer (``BlockCache.read_into``, ``ImageReader.read``)."""

from __future__ import annotations

import os
import random
from collections.abc import Iterable
from pathlib import Path

import pytest

from bootseer.image.blocks import block_count, digest
from bootseer.image.cache import CHECK_CHUNK, BlockCache
from bootseer.image.fetch import Fetcher, FetchError
from bootseer.image.manifest import Manifest
from bootseer.image.reader import READ_AHEAD, ImageReader
from bootseer.image.trace import Recorder

BLOCK = 256 << 10


def flip(cache: BlockCache, block_digest: str, at: int) -> None:
    """Flip byte ``at`` of a cached block in its pack, as a bad disk or a stray write would."""
    where = cache.locate(block_digest)
    assert where is not None
    with open(where.path, "r+b") as f:
        f.seek(where.offset + at)
        b = f.read(1)
        f.seek(where.offset + at)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.fixture
def cached(tmp_path: Path) -> tuple[BlockCache, str, bytes]:
    data = random.Random(1).randbytes(BLOCK - 1000)  # a short last piece too
    cache = BlockCache(tmp_path / "c", 1 << 30)
    d = digest(data)
    cache.put(d, data)
    return cache, d, data


@pytest.mark.parametrize(
    ("offset", "length"),
    [
        (0, BLOCK - 1000),
        (0, 1),
        (CHECK_CHUNK - 1, 2),  # across a piece boundary
        (4096, 128 << 10),  # page-aligned, not piece-aligned
        (3 * CHECK_CHUNK, CHECK_CHUNK),  # exactly one piece
        (BLOCK - 1000 - 5, 5),  # the end of the short last piece
        (100, 0),
    ],
)
def test_read_into_returns_exactly_the_range(
    cached: tuple[BlockCache, str, bytes], offset: int, length: int
) -> None:
    cache, d, data = cached
    out = bytearray(length)
    assert cache.read_into(d, offset, memoryview(out))
    assert out == data[offset : offset + length]
    assert cache.read(d, offset, length) == data[offset : offset + length]


def test_damage_in_the_pieces_a_read_touches_is_never_served(
    cached: tuple[BlockCache, str, bytes],
) -> None:
    cache, d, _ = cached
    flip(cache, d, 5 * CHECK_CHUNK + 7)
    # The damaged piece lies outside the read's own bytes, but inside a piece it touches.
    assert cache.read(d, 5 * CHECK_CHUNK + 100, 10) is None
    assert d not in cache and cache.locate(d) is None
    assert cache.dropped_bad == 1


def test_damage_elsewhere_in_the_block_is_caught_by_the_read_that_touches_it(
    cached: tuple[BlockCache, str, bytes],
) -> None:
    cache, d, data = cached
    flip(cache, d, 6 * CHECK_CHUNK + 1)
    # A read of other pieces checks only those: right bytes, block kept.
    assert cache.read(d, 0, CHECK_CHUNK) == data[:CHECK_CHUNK]
    assert d in cache
    assert cache.read(d, 6 * CHECK_CHUNK, 4096) is None
    assert d not in cache


def test_a_pack_cut_short_is_damage(cached: tuple[BlockCache, str, bytes]) -> None:
    cache, d, data = cached
    where = cache.locate(d)
    assert where is not None
    os.truncate(where.path, where.offset + len(data) - 1)
    # A read of the first piece alone does not reach the end; one of the last does.
    assert cache.read(d, 0, 10) == data[:10]
    assert cache.read(d, len(data) - 10, 10) is None
    assert d not in cache


def test_a_block_kept_from_before_is_checked_whole_then_by_pieces(
    cached: tuple[BlockCache, str, bytes], tmp_path: Path
) -> None:
    _, d, data = cached
    again = BlockCache(tmp_path / "c", 1 << 30)  # a restart: no CRCs yet
    flip(again, d, len(data) - 1)
    assert again.read(d, 0, 10) is None  # the first read checks the SHA-256 of all of it
    assert again.dropped_bad == 1
    again.put(d, data)
    fresh = BlockCache(tmp_path / "c", 1 << 30)
    assert fresh.read(d, 10, 20) == data[10:30]
    flip(fresh, d, 0)
    assert fresh.read(d, 0, 1) is None  # the pieces recorded by the first read


class _Source:
    def __init__(self, data: bytes, block: int) -> None:
        self.data, self.block = data, block
        self.reads = 0

    def read_block(
        self, index: int, block_digest: str, offset: int, length: int, priority: int
    ) -> bytes:
        self.reads += 1
        return self.data[offset : offset + length]

    def describe(self) -> str:
        return "test"


class _Image:
    def __init__(self, manifest: Manifest, source: _Source) -> None:
        self.manifest, self.source = manifest, source


class _Job:
    def __init__(self, image: _Image) -> None:
        self.image = image
        self.recorder = Recorder(image.manifest.nblocks, 60)


def read(reader: ImageReader, job: _Job, offset: int, size: int) -> bytes:
    return bytes(reader.read(job, offset, size))


def _image(size: int, block: int, seed: int = 2) -> tuple[_Job, bytes]:
    data = random.Random(seed).randbytes(size)
    blocks = [digest(data[i : i + block]) for i in range(0, size, block)]
    assert len(blocks) == block_count(size, block)
    manifest = Manifest(size=size, block_size=block, blocks=tuple(blocks))
    return _Job(_Image(manifest, _Source(data, block))), data


def test_reads_across_block_boundaries_come_whole_from_cache_and_fetcher(tmp_path: Path) -> None:
    block = 64 << 10
    job, data = _image(5 * block + 123, block)
    cache = BlockCache(tmp_path / "c", 1 << 30)
    fetcher = Fetcher(cache, workers=4, timeout=10)
    reader = ImageReader(cache, fetcher)
    try:
        m = job.image.manifest
        cache.put(m.blocks[1], data[block : 2 * block])  # one local, its neighbours not
        rng = random.Random(3)
        cases = [(block - 10, 20), (0, len(data)), (3 * block - 1, block + 2), (len(data) - 7, 100)]
        cases += [
            (rng.randrange(len(data)), rng.choice([1, 4096, 131072, 1 << 20])) for _ in range(40)
        ]
        for off, size in cases:
            assert read(reader, job, off, size) == data[off : off + size], (off, size)
        # Now all local: the cache serves the same bytes across blocks, nothing fetched.
        before = job.image.source.reads
        assert read(reader, job, block - 10, 3 * block) == data[block - 10 : 4 * block - 10]
        assert job.image.source.reads == before
        assert read(reader, job, len(data), 10) == b""
    finally:
        fetcher.stop()


def test_a_damaged_cached_block_is_fetched_again_not_served(tmp_path: Path) -> None:
    block = 64 << 10
    job, data = _image(3 * block, block)
    cache = BlockCache(tmp_path / "c", 1 << 30)
    fetcher = Fetcher(cache, workers=2, timeout=10)
    reader = ImageReader(cache, fetcher)
    try:
        assert read(reader, job, 0, len(data)) == data
        source = job.image.source
        before = source.reads
        flip(cache, job.image.manifest.blocks[1], CHECK_CHUNK + 5)
        piece = memoryview(bytearray(4096))
        assert not cache.read_into(job.image.manifest.blocks[1], CHECK_CHUNK, piece)
        assert read(reader, job, block, block) == data[block : 2 * block]
        assert source.reads == before + 1
    finally:
        fetcher.stop()


def test_a_block_the_source_cannot_serve_fails_in_bounded_time(tmp_path: Path) -> None:
    block = 64 << 10
    job, data = _image(2 * block, block)

    class Broken(_Source):
        def read_block(self, *a: object) -> bytes:
            raise OSError("store down")

    job.image.source = Broken(data, block)
    fetcher = Fetcher(BlockCache(tmp_path / "c", 1 << 30), workers=2, timeout=0.5)
    try:
        with pytest.raises(FetchError, match="store down"):
            read(ImageReader(fetcher.cache, fetcher), job, block - 1, 2)
    finally:
        fetcher.stop()


def test_a_sequential_reader_has_the_next_blocks_read_ahead(tmp_path: Path) -> None:
    block = 64 << 10
    job, data = _image(200 * block, block)
    advised: list[int] = []
    m = job.image.manifest
    index = {d: i for i, d in enumerate(m.blocks)}

    class Cache(BlockCache):
        def advise(self, digests: Iterable[str]) -> None:
            advised.extend(index[d] for d in digests)

    cache = Cache(tmp_path / "c", 1 << 30)
    for i in range(m.nblocks):
        cache.put(m.blocks[i], data[i * block : (i + 1) * block])
    fetcher = Fetcher(cache, workers=1, timeout=10)
    reader = ImageReader(cache, fetcher)
    try:
        assert read(reader, job, 0, 1 << 20) == data[: 1 << 20]
        assert advised == list(range(16))  # the request's own blocks, at once
        advised.clear()
        assert read(reader, job, 1 << 20, 1 << 20) == data[1 << 20 : 2 << 20]
        ahead = (2 << 20) + READ_AHEAD
        assert advised == list(range(16, ahead // block + 1))
        advised.clear()
        assert read(reader, job, 2 << 20, 1 << 20) == data[2 << 20 : 3 << 20]
        assert advised == list(range(ahead // block + 1, ((3 << 20) + READ_AHEAD) // block + 1))
        advised.clear()
        assert read(reader, job, 100 * block + 5, 10) == data[100 * block + 5 : 100 * block + 15]
        assert advised == []  # a lone block, far away: read at once, nothing ahead
    finally:
        fetcher.stop()


def test_a_read_for_the_mount_leaves_none_of_its_pack_in_the_page_cache(tmp_path: Path) -> None:
    """The agent's FUSE reply goes into the job file's page cache; the pack's pages it
    read are dropped again, so the node's memory holds the image's bytes once. A read
    reads its own range only: no page of a neighbouring block comes with it."""
    from tests.imagekit import resident_bytes

    cache = BlockCache(tmp_path / "c", 1 << 30)
    rng = random.Random(3)
    blocks = [rng.randbytes(BLOCK) for _ in range(6)] + [rng.randbytes(BLOCK - 1000)]
    digests = [digest(b) for b in blocks]
    for d, b in zip(digests, blocks, strict=True):
        cache.put(d, b)
    where = [cache.locate(d) for d in digests]
    assert all(w is not None for w in where)
    pack = where[0].path  # type: ignore[union-attr]
    if resident_bytes(pack) != 0:
        pytest.skip("no O_DIRECT here: the pack's writes went through the page cache")

    # Without ``drop`` (a peer's read, the fill's check), the range read stays cached,
    # and only it: the block before and the block after are not read with it.
    out = memoryview(bytearray(128 << 10))
    assert cache.read_into(digests[2], 64 << 10, out)
    assert out == blocks[2][64 << 10 : 192 << 10]
    w2 = where[2]
    assert w2 is not None
    assert resident_bytes(pack, w2.offset + (64 << 10), 128 << 10) == 128 << 10
    assert resident_bytes(pack) == 128 << 10

    # With it (the FUSE read path), nothing of the pack stays: the partial pieces at the
    # range's ends and a short last block's padded page included.
    for i, (d, b) in enumerate(zip(digests, blocks, strict=True)):
        lo = 5000 if i % 2 else 0
        out = memoryview(bytearray(len(b) - lo - 7))
        assert cache.read_into(d, lo, out, drop=True)
        assert out == b[lo : len(b) - 7]
    assert resident_bytes(pack) == 0
    cache.close()


def test_reads_through_the_reader_are_counted_and_leave_the_pack_uncached(tmp_path: Path) -> None:
    """Each read that reaches the agent counts (``stats``: ``read_requests``,
    ``read_bytes``), and the reader asks the cache to drop what it read."""
    from tests.imagekit import resident_bytes

    job, data = _image(3 * BLOCK + 777, BLOCK)
    m = job.image.manifest
    cache = BlockCache(tmp_path / "c", 1 << 30)
    for i in range(m.nblocks):
        cache.put(m.blocks[i], data[i * BLOCK : (i + 1) * BLOCK])
    where = cache.locate(m.blocks[0])
    assert where is not None
    if resident_bytes(where.path) != 0:
        pytest.skip("no O_DIRECT here: the pack's writes went through the page cache")
    fetcher = Fetcher(cache, workers=2, timeout=10)
    reader = ImageReader(cache, fetcher)
    try:
        assert read(reader, job, 0, 1 << 20) == data[: 1 << 20]
        assert read(reader, job, 1 << 20, 1 << 20) == data[1 << 20 :]
        assert (reader.requests, reader.bytes) == (2, len(data))
        assert job.image.source.reads == 0
        assert resident_bytes(where.path) == 0
        # A read that missed, whose block another thread put meanwhile (the reader's
        # fallback: Fetcher.get), drops the pack's copy too.
        assert fetcher.get(job.image.source, m, 1) == data[BLOCK : 2 * BLOCK]
        assert resident_bytes(where.path) == 0
    finally:
        fetcher.stop()
