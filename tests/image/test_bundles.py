"""Bundles: a trace's hot blocks stored again in trace order, read by a cold node in a
few large requests, each block still checked by its digest (bootseer.image.bundles)."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import devcluster
import pytest

from bootseer.image.bundles import (
    BundleSource,
    bundle_id,
    bundle_key,
    complete,
    index,
    write_bundles,
)
from bootseer.image.cache import BlockCache
from bootseer.image.fetch import Fetcher, FetchStats, StoreSource
from bootseer.image.manifest import Manifest, upload_file
from bootseer.image.prefetch import PrefetchResult, prefetch_hot
from bootseer.image.registry import remove_name, tag_image
from bootseer.image.trace import Trace, TraceError, _checksum, load_trace, save_trace
from bootseer.image.views import trace_summary
from bootseer.store import Store, open_store
from tests.sitekeys import KEYS
from tests.waiting import wait_until

BS = 64 << 10


def image(tmp_path: Path, nblocks: int, extra: int = 100) -> tuple[Store, Manifest, bytes]:
    """A stored image of ``nblocks`` blocks, its last one ``extra`` bytes long."""
    store = open_store(f"file://{tmp_path}/store")
    data = os.urandom((nblocks - 1) * BS + extra)
    f = tmp_path / "img.sqsh"
    f.write_bytes(data)
    return store, upload_file(store, str(f), BS, keys=KEYS), data


def cached(m: Manifest, data: bytes) -> Callable[[str, int], bytes | None]:
    """A reader of block bytes by digest, as the agent's cache gives them."""
    by_digest = {d: data[i * BS : i * BS + m.block_length(i)] for i, d in enumerate(m.blocks)}
    return lambda d, n: by_digest.get(d)


def prefetch_checked(
    tmp_path: Path, source: BundleSource, m: Manifest, trace: Trace, data: bytes
) -> tuple[PrefetchResult, FetchStats]:
    """The hot set prefetched through ``source`` into a new cache, every block of it
    there with the image's own bytes: the prefetch's result and the fetcher's stats."""
    fetcher = Fetcher(BlockCache(tmp_path / "c", 1 << 30), workers=4)
    try:
        res = prefetch_hot(fetcher, source, m, trace.blocks, time.monotonic() + 60, 1.0, 8 << 20)
        for i in trace.blocks:
            assert fetcher.cache.read(m.blocks[i], 0, BS) == data[i * BS : (i + 1) * BS]
        return res, fetcher.stats
    finally:
        fetcher.stop()


def test_a_trace_names_its_bundles_and_a_merge_keeps_those_of_whole_chunks() -> None:
    t = Trace("ab" * 32, 10, BS, (5, 1, 2, 9, 0)).with_bundles(2, ["01" * 32, None, "02" * 32])
    back = Trace.from_json(t.to_json(), t.image, 10, BS)
    assert back == t and back.chunks(2) == [(5, 1), (2, 9), (0,)]
    merged = back.merged([7, 5])
    assert merged is not None and merged.blocks == (5, 1, 2, 9, 0, 7)
    # The last chunk (0,) grew to (0, 7): its bundle is no longer it.
    assert merged.bundle_blocks == 2 and merged.bundles == ("01" * 32, None)
    plain = Trace("ab" * 32, 10, BS, (3,))
    assert b"bundle" not in plain.to_json()  # as traces were before bundles


@pytest.mark.parametrize(
    ("bundle_blocks", "bundles", "message"),
    [
        (0, ["01" * 32], "not a positive block count"),
        (True, ["01" * 32], "not a positive block count"),
        (2, ["01" * 32] * 3, "one bundle id per chunk"),
        (2, ["../../x"], "no bundle id"),
        (2, ["AB" * 32], "no bundle id"),
    ],
)
def test_a_trace_naming_bad_bundles_is_refused(
    bundle_blocks: int, bundles: list[str], message: str
) -> None:
    body = Trace("ab" * 32, 10, BS, (1, 2, 3))._body()
    body["bundle_blocks"], body["bundles"] = bundle_blocks, bundles
    body["checksum"] = _checksum(body)  # whole, as a writer of it would have made it
    with pytest.raises(TraceError, match=message):
        Trace.from_json(json.dumps(body).encode(), "ab" * 32, 10, BS)


def test_bundles_bring_the_hot_set_in_a_few_reads_each_block_checked(tmp_path: Path) -> None:
    store, m, data = image(tmp_path, 12)
    trace = Trace(m.id, m.nblocks, BS, (11, 3, 4, 5, 0, 8, 9))
    done = write_bundles(store, m, trace, 4, cached(m, data), 1 << 30)
    assert done.written == 2 and done.kept == 0 and None not in done.bundles
    assert done.bytes == sum(m.block_length(i) for i in trace.blocks)
    trace = trace.with_bundles(4, done.bundles)
    assert complete(m, trace, 4, 1 << 30)
    # Bundles hold the blocks in trace order: the last block of the image (short) first.
    first = store.read_bytes(bundle_key(m.id, done.bundles[0] or ""))
    assert first == b"".join(data[i * BS : i * BS + m.block_length(i)] for i in (11, 3, 4, 5))
    # Written again: each bundle is found, not written twice.
    assert write_bundles(store, m, trace, 4, cached(m, data), 1 << 30).written == 0

    source = BundleSource(StoreSource(store), index(m, [trace]))
    res, stats = prefetch_checked(tmp_path, source, m, trace, data)
    assert res.complete and res.fetched_blocks == 7
    assert source.stats.reads == 2 and source.stats.blocks == 7 and stats.runs == 2


def test_a_bundle_that_lies_costs_its_blocks_a_read_each_never_a_wrong_byte(
    tmp_path: Path,
) -> None:
    store, m, data = image(tmp_path, 8)
    trace = Trace(m.id, m.nblocks, BS, (0, 1, 2, 3, 4, 5))
    done = write_bundles(store, m, trace, 3, cached(m, data), 1 << 30)
    trace = trace.with_bundles(3, done.bundles)
    key = bundle_key(m.id, done.bundles[0] or "")
    bad = bytearray(store.read_bytes(key))
    bad[BS + 7] ^= 1  # block 1, one bit
    store.write_bytes(key, bytes(bad))
    store.write_bytes(bundle_key(m.id, done.bundles[1] or ""), b"short")
    source = BundleSource(StoreSource(store), index(m, [trace]))
    res, _ = prefetch_checked(tmp_path, source, m, trace, data)
    assert res.complete and res.failed == 0
    assert source.stats.blocks == 2 and source.stats.refused == 4


def test_a_chunk_with_a_block_not_here_and_chunks_past_the_cap_are_not_bundled(
    tmp_path: Path,
) -> None:
    store, m, data = image(tmp_path, 8, extra=BS)
    trace = Trace(m.id, m.nblocks, BS, (0, 1, 2, 3, 4, 5, 6))
    read = cached(m, data)
    done = write_bundles(
        store, m, trace, 2, lambda d, n: None if d == m.blocks[3] else read(d, n), 6 * BS
    )
    # Chunks (0, 1) (2, 3) (4, 5) (6,): the second lacks block 3; the fourth is past 6 blocks.
    assert done.bundles[0] is not None and done.bundles[1] is None and done.bundles[2] is not None
    assert len(done.bundles) == 3 and done.written == 2
    assert not complete(m, trace.with_bundles(2, done.bundles), 2, 6 * BS)
    assert complete(m, trace.with_bundles(2, done.bundles), 2, 2 * BS)


def test_trace_summary_says_how_much_of_the_hot_set_is_bundled(tmp_path: Path) -> None:
    _, m, _ = image(tmp_path, 6, extra=BS)
    trace = Trace(m.id, m.nblocks, BS, (0, 1, 2, 3)).with_bundles(2, [bundle_id(["x"]), None])
    s = trace_summary(m, trace)
    assert s["hot_bytes"] == 4 * BS and s["bundled_bytes"] == 2 * BS


def test_gc_removes_bundles_no_trace_names_and_all_with_their_image(tmp_path: Path) -> None:
    from bootseer.image.gc import collect

    store, m, data = image(tmp_path, 8)
    tag_image(store, "a:1", m, keys=KEYS)
    trace = Trace(m.id, m.nblocks, BS, (0, 1, 2, 3))
    done = write_bundles(store, m, trace, 2, cached(m, data), 1 << 30)
    save_trace(store, trace.with_bundles(2, done.bundles), keys=KEYS, user="alice")
    stale = bundle_key(m.id, bundle_id(["gone"]))
    store.write_bytes(stale, b"a chunk an earlier trace had")
    report = collect(store, grace=0)
    assert report.bundles == 1 and not store.exists(stale)
    assert all(store.exists(bundle_key(m.id, b or "")) for b in done.bundles)
    assert load_trace(store, m, keys=KEYS, user="alice") is not None  # the trace stays
    # A trace gc cannot read: every bundle of its image stays.
    store.write_bytes(stale, b"x")
    store.write_bytes(f"images/traces/{m.id}/bob.json", b"not a trace")
    assert collect(store, grace=0).bundles == 0 and store.exists(stale)
    store.delete(f"images/traces/{m.id}/bob.json")
    remove_name(store, "a:1")
    report = collect(store, grace=0)
    assert report.bundles == 3 and report.traces == 1
    assert store.list(f"images/traces/{m.id}", recursive=True) == []


# -- the agent: written at the epilog, read by the next cold node -------------------------


@pytest.mark.fuse
@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("mksquashfs") or not os.path.exists("/dev/fuse"),
    reason="needs root, /dev/fuse and squashfs-tools",
)
def test_a_cold_nodes_next_start_reads_the_hot_set_from_bundles(base: Path) -> None:
    from tests.imagekit import add_image, make_squashfs, running_agent

    img = make_squashfs(base / "img.sqsh", {"a": 1_500_000, "b": 300_000}, seed=7)
    image_id = add_image(base, img, "bundled:1")
    store = open_store(f"file://{base}/store")
    from bootseer.image.manifest import load_manifest

    m = load_manifest(store, image_id, keys=KEYS)
    with running_agent(base, bundle_kib=256) as agent:
        got = agent.prepare(1, "bundled:1")
        Path(got["path"]).read_bytes()  # the whole image: every block is hot
        agent.release(1)
        wait_until(
            lambda: (
                (t := load_trace(store, m, keys=KEYS, user="root")) is not None
                and complete(m, t, 4, 1 << 30)
            ),
            "the first job's trace naming its bundles",
        )
    trace = load_trace(store, m, keys=KEYS, user="root")
    assert trace is not None and len(trace.bundles) == -(-m.nblocks // 4)
    shutil.rmtree(base / "t1" / "cache" / "image")  # a cold node: nothing cached
    with running_agent(base, bundle_kib=256) as agent:
        got = agent.prepare(2, "bundled:1")
        assert got["prefetch"]["fetched_blocks"] == m.nblocks
        assert Path(got["path"]).read_bytes() == img.read_bytes()
        agent.release(2)
        log = agent.log_text()
    line = re.search(r"job=2 bundles: (\d+) reads, (\d+) blocks, \d+ bytes, (\d+) refused", log)
    assert line is not None, log[-3000:]
    assert [int(g) for g in line.groups()] == [len(trace.bundles), m.nblocks, 0]


def test_bundles_are_written_only_once_the_nodes_starts_are_quiet(tmp_path: Path) -> None:
    """The agent writes a bundle only when no job on the node fetched or read just now
    (Fetcher.wait_quiet, the fill's rule): the upload never takes a starting job's link."""
    store, m, data = image(tmp_path, 4)
    fetcher = Fetcher(BlockCache(tmp_path / "c", 1 << 30), workers=1, read_quiet=0.5)
    try:
        fetcher.last_read = time.monotonic()  # a job read its image just now
        t0 = time.monotonic()
        trace = Trace(m.id, m.nblocks, BS, (0, 1, 2, 3))
        done = write_bundles(store, m, trace, 2, cached(m, data), 1 << 30, fetcher.wait_quiet)
        assert done.written == 2
        assert time.monotonic() - t0 >= 0.5
    finally:
        fetcher.stop()


@pytest.mark.s3
def test_bundles_in_an_s3_store_are_read_in_ranged_reads_each_block_checked(
    tmp_path: Path, s3_store: devcluster.Cluster
) -> None:
    store = s3_store.open_store()
    f = tmp_path / "img.sqsh"
    data = os.urandom(9 * BS + 5)
    f.write_bytes(data)
    m = upload_file(store, str(f), BS, keys=KEYS)
    trace = Trace(m.id, m.nblocks, BS, (9, 0, 1, 2, 7, 8))
    done = write_bundles(store, m, trace, 3, cached(m, data), 1 << 30)
    key = bundle_key(m.id, done.bundles[1] or "")
    bad = bytearray(store.read_bytes(key))
    bad[-1] ^= 1  # block 8, its last byte
    store.write_bytes(key, bytes(bad))
    source = BundleSource(StoreSource(store), index(m, [trace.with_bundles(3, done.bundles)]))
    res, _ = prefetch_checked(tmp_path, source, m, trace, data)
    assert res.complete and source.stats.reads == 2
    assert (source.stats.blocks, source.stats.refused) == (5, 1)
