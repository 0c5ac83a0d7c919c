"""The block cache's packs: blocks appended to a few large files with an index each, not a
file per block (issue 19 item 3: ext4's file per block was 39% of the peer receiver's
CPU). What a crash half-wrote is never trusted, eviction gives the disk back, a restart
finds the blocks, and an upgraded agent removes the layout before."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import stat
import struct
import subprocess
import threading
from pathlib import Path

import pytest
from crc32c import crc32c

from bootseer.image.blocks import digest
from bootseer.image.cache import RECORD_BYTES, BlockCache, Where, checked_crcs, crcs_match

BLOCK = 256 << 10


def blocks(n: int, size: int = BLOCK, seed: int = 1) -> dict[str, bytes]:
    rng = random.Random(seed)
    out = {}
    for _ in range(n):
        b = rng.randbytes(size)
        out[digest(b)] = b
    return out


def where(cache: BlockCache, d: str) -> Where:
    w = cache.locate(d)
    assert w is not None
    return w


def index_of(w: Where) -> Path:
    return w.path.with_suffix(".idx")


def test_blocks_share_a_few_packs_and_a_restart_finds_them(tmp_path: Path) -> None:
    bs = blocks(20, size=BLOCK - 100)  # not page-aligned: each padded to the next page
    cache = BlockCache(tmp_path / "c", 1 << 30, segment_bytes=8 * BLOCK)
    for d, b in bs.items():
        cache.put(d, b)
    packs = sorted((tmp_path / "c" / "packs").glob("*.pack"))
    assert len(packs) == 3  # 8 + 8 + 4 blocks, not 20 files
    assert all(where(cache, d).offset % 4096 == 0 for d in bs)
    # The pack appended to is allocated ahead (here: to its full length); given back when
    # a restart finds it.
    assert packs[2].stat().st_size == 8 * BLOCK
    again = BlockCache(tmp_path / "c", 1 << 30, segment_bytes=8 * BLOCK)
    assert packs[2].stat().st_size == 4 * BLOCK
    assert len(again) == 20 and again.bytes == sum(map(len, bs.values()))
    assert all(again.read(d, 0, len(b)) == b for d, b in bs.items())  # SHA-256 checked
    # A restarted cache appends to a pack of its own, never to one it found.
    extra = blocks(1, seed=2)
    ((d, b),) = extra.items()
    again.put(d, b)
    assert where(again, d).path not in packs and where(again, d).offset == 0
    assert BlockCache(tmp_path / "c", 1 << 30).read(d, 0, len(b)) == b


def test_a_torn_index_record_is_dropped_the_others_kept(tmp_path: Path) -> None:
    bs = blocks(4)
    cache = BlockCache(tmp_path / "c", 1 << 30)
    for d, b in bs.items():
        cache.put(d, b)
    ds = list(bs)
    idx = index_of(where(cache, ds[0]))
    raw = bytearray(idx.read_bytes())
    assert len(raw) == 4 * RECORD_BYTES
    raw[RECORD_BYTES + 40] ^= 0x01  # the second record's offset: its CRC no longer holds
    raw += raw[:30]  # a record cut short by a crash
    idx.write_bytes(raw)
    again = BlockCache(tmp_path / "c", 1 << 30)
    assert ds[1] not in again and again.dropped_records == 2
    assert all(again.read(d, 0, BLOCK) == bs[d] for d in (ds[0], ds[2], ds[3]))


def test_a_pack_shorter_than_its_index_drops_the_blocks_past_its_end(tmp_path: Path) -> None:
    bs = blocks(3)
    cache = BlockCache(tmp_path / "c", 1 << 30)
    for d, b in bs.items():
        cache.put(d, b)
    ds = list(bs)
    last = where(cache, ds[2])
    os.truncate(last.path, last.offset + 1000)  # the crash came before its bytes
    again = BlockCache(tmp_path / "c", 1 << 30)
    assert ds[2] not in again and again.dropped_records == 1
    assert again.read(ds[0], 0, BLOCK) == bs[ds[0]] and again.read(ds[1], 0, 10) == bs[ds[1]][:10]


def test_a_record_whose_bytes_never_reached_the_disk_fails_its_first_read(tmp_path: Path) -> None:
    """The index record survived the crash, the block's bytes did not (zeros, or an older
    block's): the first read after the restart checks the SHA-256 and drops it."""
    bs = blocks(2)
    cache = BlockCache(tmp_path / "c", 1 << 30)
    for d, b in bs.items():
        cache.put(d, b)
    d0, d1 = bs
    w = where(cache, d0)
    with open(w.path, "r+b") as f:
        f.seek(w.offset)
        f.write(bs[d1][:4096])
    again = BlockCache(tmp_path / "c", 1 << 30)
    assert d0 in again and again.read(d0, 4096, 10) is None and d0 not in again
    assert again.dropped_bad == 1 and again.read(d1, 0, BLOCK) == bs[d1]


def test_a_cache_of_sha256_blocks_from_before_blake3_is_still_read_and_checked(
    tmp_path: Path,
) -> None:
    """An agent upgraded in place keeps its cache: blocks named by SHA-256 (index records
    ``BSP1``, byte for byte what the release before wrote) are found, checked by SHA-256
    on their first read, served, and a damaged one is still caught; BLAKE3 blocks put
    beside them get records of their own (``BSB3``)."""
    rng = random.Random(7)
    old = {hashlib.sha256(b).hexdigest(): b for b in (rng.randbytes(BLOCK) for _ in range(3))}
    new = blocks(2, seed=8)
    assert all(d.startswith("blake3:") for d in new)
    cache = BlockCache(tmp_path / "c", 1 << 30)
    for d, b in {**old, **new}.items():
        cache.put(d, b)
    raw = index_of(where(cache, next(iter(old)))).read_bytes()
    records = [raw[at : at + RECORD_BYTES] for at in range(0, len(raw), RECORD_BYTES)]
    for (d, b), rec in zip(old.items(), records, strict=False):
        w = where(cache, d)
        head = struct.pack("<4s32sQI", b"BSP1", bytes.fromhex(d), w.offset, len(b))
        head += bytes(RECORD_BYTES - 4 - len(head))
        assert rec == head + crc32c(head).to_bytes(4, "little")  # the release before's
    assert [r[:4] for r in records] == [b"BSP1"] * 3 + [b"BSB3"] * 2
    d_bad, d_good, d_held = old
    w = where(cache, d_bad)
    with open(w.path, "r+b") as f:  # damaged on disk while the agent was down
        f.seek(w.offset + 100)
        f.write(b"\xff")
    again = BlockCache(tmp_path / "c", 1 << 30)
    assert len(again) == 5 and again.dropped_records == 0
    assert again.read(d_good, 0, BLOCK) == old[d_good]  # its SHA-256 checked
    assert again.read(d_bad, 0, BLOCK) is None and d_bad not in again
    assert all(again.read(d, 0, BLOCK) == b for d, b in new.items())
    opened = again.open_held(d_held)  # served to root's readers by CRC once checked
    assert opened is None and again.read(d_held, 0, 10) == old[d_held][:10]
    opened = again.open_held(d_held)
    assert opened is not None
    fd, w, crcs = opened
    os.close(fd)  # opened past the page cache: read here by its name
    with open(w.path, "rb") as f:
        f.seek(w.offset)
        assert crcs_match(crcs, f.read(w.size))


def test_eviction_gives_the_disk_back_and_removes_an_empty_pack(tmp_path: Path) -> None:
    bs = blocks(24)
    cache = BlockCache(tmp_path / "c", cap_bytes=8 * BLOCK, segment_bytes=8 * BLOCK)
    ds = list(bs)
    for d in ds[:8]:
        cache.put(d, bs[d])
    first = where(cache, ds[0]).path
    full = os.stat(first).st_blocks * 512
    assert full >= 8 * BLOCK
    for d in ds[8:12]:  # 4 evicted from the first pack: their pages punched out
        cache.put(d, bs[d])
    assert cache.evicted == 4 and cache.bytes == 8 * BLOCK
    # The 4 blocks left, and room for the filesystem's own (an extent tree's block).
    assert os.stat(first).st_blocks * 512 <= 4 * BLOCK + (64 << 10)
    assert os.stat(first).st_size >= 8 * BLOCK  # the pack keeps its length
    for d in ds[12:16]:  # the rest of the first pack's blocks go: the pack with them
        cache.put(d, bs[d])
    assert not first.exists() and not first.with_suffix(".idx").exists()
    # A restart skips the punched blocks' records (holes), keeps the others.
    again = BlockCache(tmp_path / "c", cap_bytes=8 * BLOCK)
    assert {d for d in ds if d in again} == set(ds[8:16])
    assert again.evicted == 0 and again.dropped_records == 0 and again.dropped_bad == 0
    assert all(again.read(d, 0, BLOCK) == bs[d] for d in ds[8:16])


def test_eviction_keeps_pinned_blocks_first(tmp_path: Path) -> None:
    bs = blocks(6, size=10000)
    ds = list(bs)
    cache = BlockCache(tmp_path / "c", cap_bytes=3 * 10000)
    cache.pin(ds[:2])
    for d in ds:
        cache.put(d, bs[d])
    assert ds[0] in cache and ds[1] in cache and cache.bytes <= 3 * 10000
    cache.unpin(ds[:2])


def test_many_blocks_put_at_once_are_each_whole(tmp_path: Path) -> None:
    """The fetch workers put blocks at once: each gets its own range of the pack, the
    packs roll over between them, and a block put twice at once is held once."""
    bs = blocks(96, size=64 << 10)
    ds = list(bs)
    cache = BlockCache(tmp_path / "c", 1 << 30, segment_bytes=1 << 20)
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for d in ds[k::8] + ds[:8]:  # the first 8 blocks by every thread
                cache.put(d, bs[d])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(cache) == 96 and cache.bytes == 96 * (64 << 10)
    assert all(cache.read(d, 0, 64 << 10) == bs[d] for d in ds)
    spans = sorted((w.path, w.offset) for w in (where(cache, d) for d in ds))
    assert len(set(spans)) == 96
    again = BlockCache(tmp_path / "c", 1 << 30)
    assert len(again) == 96 and again.dropped_records == 0
    assert all(again.read(d, 0, 64 << 10) == bs[d] for d in ds)


def test_the_cache_is_roots_alone(tmp_path: Path) -> None:
    cache = BlockCache(tmp_path / "c", 1 << 30)
    ((d, b),) = blocks(1).items()
    cache.put(d, b)
    w = where(cache, d)
    for p in (tmp_path / "c", tmp_path / "c" / "packs"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o700
    for p in (w.path, index_of(w)):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600


def test_an_upgraded_agent_removes_the_cache_of_a_file_per_block(tmp_path: Path) -> None:
    """The layout before (``blocks/<aa>/<digest>``) is dropped, not imported: its blocks
    are fetched again as needed. Renamed first, removed by a thread: a restart mid-way
    finishes the removal."""
    bs = blocks(3)
    old = tmp_path / "c" / "blocks"
    for d, b in bs.items():
        (old / d[:2]).mkdir(parents=True, exist_ok=True)
        (old / d[:2] / d).write_bytes(b)
    half = tmp_path / "c" / "blocks.removing-0123abcd"  # an earlier start's, cut short
    (half / "ab").mkdir(parents=True)
    (half / "ab" / "ab00").write_bytes(b"x")
    log: list[str] = []
    cache = BlockCache(tmp_path / "c", 1 << 30, log.append)
    assert cache.old_layout_removed(timeout=120)
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["packs"]
    assert len(cache) == 0 and all(d not in cache for d in bs)
    assert any("layout before" in line for line in log), log
    d = next(iter(bs))
    cache.put(d, bs[d])
    assert cache.read(d, 0, BLOCK) == bs[d]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="needs root")
def test_a_full_disk_serves_uncached_and_leaves_no_half_block(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], check=True)
    try:
        bs = blocks(8)
        cache = BlockCache(disk / "c", 1 << 30)
        for d, b in bs.items():
            cache.put(d, b)  # never raises: the caller serves the block it verified
        kept = [d for d in bs if d in cache]
        assert cache.unwritten == 8 - len(kept) > 0 and kept
        assert all(cache.read(d, 0, BLOCK) == bs[d] for d in kept)
        used = sum(p.stat().st_blocks * 512 for p in (disk / "c" / "packs").iterdir())
        assert used <= len(kept) * BLOCK + (64 << 10)  # the half-written ones punched out
        again = BlockCache(disk / "c", 1 << 30)
        assert {d for d in bs if d in again} <= set(kept)
        assert all(again.read(d, 0, BLOCK) == bs[d] for d in bs if d in again)
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def test_blocks_put_together_lie_end_to_end_written_from_where_they_are(tmp_path: Path) -> None:
    """``put_many`` (a run's blocks): laid end to end in the pack in one write, the
    page-aligned ones from their own buffer (no copy), a short one padded with zeros to
    its page, the index records after; one already held or given twice is put once."""
    from bootseer.directio import Buffers, aligned_at

    bs = list(blocks(5).items())
    short = list(blocks(1, size=BLOCK - 100, seed=3).items())
    buf = Buffers(keep=1).get(5 * BLOCK)
    view = memoryview(buf)
    for k, (_, b) in enumerate(bs):
        view[k * BLOCK : (k + 1) * BLOCK] = b
    parts = [(d, view[k * BLOCK : (k + 1) * BLOCK], None) for k, (d, _) in enumerate(bs)]
    assert all(aligned_at(p) for _, p, _ in parts) and not aligned_at(bs[0][1])
    # The CRCs a caller took as it checked the block (the peer receiver's): used as they are.
    crcs = checked_crcs(parts[0][1], bs[0][0])
    assert crcs is not None and checked_crcs(parts[0][1], bs[1][0]) is None
    cache = BlockCache(tmp_path / "c", 1 << 30)
    cache.put(*bs[1])  # held already
    cache.put_many(
        [
            (bs[0][0], parts[0][1], crcs),
            parts[1],
            parts[2],
            (*short[0], None),
            parts[3],
            parts[2],
            parts[4],
        ]
    )
    assert all(cache.read(d, 0, len(b)) == b for d, b in bs + short)  # by their CRCs
    ws = [where(cache, d) for d, _ in [bs[0], bs[2], short[0], bs[3], bs[4]]]
    assert [w.offset - ws[0].offset for w in ws] == [0, BLOCK, 2 * BLOCK, 3 * BLOCK, 4 * BLOCK]
    raw = ws[0].path.read_bytes()
    assert raw[ws[2].offset + BLOCK - 100 : ws[2].offset + BLOCK] == bytes(100)  # padded
    records = index_of(ws[0]).read_bytes()
    assert len(records) == 6 * RECORD_BYTES  # bs[1]'s, then the five in one append
    del parts, view
    again = BlockCache(tmp_path / "c", 1 << 30)
    assert len(again) == 6
    assert all(again.read(d, 0, len(b)) == b for d, b in bs + short)  # SHA-256 checked


def test_more_blocks_at_once_than_one_write_takes_are_each_whole(tmp_path: Path) -> None:
    """More parts than one ``pwritev`` takes (IOV_MAX): written in turn, each whole."""
    bs = blocks(os.sysconf("SC_IOV_MAX") + 3, size=4096)
    cache = BlockCache(tmp_path / "c", 1 << 30)
    cache.put_many([(d, b, None) for d, b in bs.items()])
    assert len(cache) == len(bs) and all(cache.read(d, 0, len(b)) == b for d, b in bs.items())
