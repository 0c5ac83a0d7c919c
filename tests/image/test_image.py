"""Image library pieces without FUSE: blocks, manifests, registry, cache, fetcher, traces."""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from bootseer.config import SiteConfig
from bootseer.errors import ConfigError, ManifestError, StoreError
from bootseer.image.blocks import block_range, check_block_size, digest
from bootseer.image.cache import BlockCache
from bootseer.image.fetch import (
    BACKGROUND,
    NEVER,
    Fetcher,
    FetchError,
    FileSource,
    StoreSource,
)
from bootseer.image.manifest import Manifest, hash_file, upload_file
from bootseer.image.prefetch import BackgroundFill, prefetch_hot
from bootseer.image.registry import (
    RegistrationLock,
    check_image_file,
    lookup_name,
    open_image_file,
    register_path,
    tag_image,
)
from bootseer.image.trace import Recorder, Trace, TraceError
from bootseer.p2p.owner import TREES
from bootseer.store import open_store
from tests.sitekeys import KEYS
from tests.waiting import wait_until

if TYPE_CHECKING:
    from bootseer.agent.jobs import Jobs

BS = 64 << 10


def sqsh_file(path: Path, size: int, seed: int = 0) -> Path:
    data = b"hsqs" + os.urandom(size - 4) if seed == 0 else b"hsqs" + bytes([seed]) * (size - 4)
    path.write_bytes(data)
    return path


def test_block_math() -> None:
    assert list(block_range(0, 1, BS)) == [0]
    assert list(block_range(BS - 1, 2, BS)) == [0, 1]
    assert list(block_range(5, 0, BS)) == []
    with pytest.raises(ValueError):
        check_block_size(100_000)


def test_manifest_round_trip_and_tamper(tmp_path: Path) -> None:
    f = sqsh_file(tmp_path / "a.sqsh", 3 * BS + 10)
    m = hash_file(str(f), BS)
    assert m.nblocks == 4 and m.block_length(3) == 10
    assert Manifest.from_json(m.to_json(), m.id) == m
    tampered = m.to_json().replace(m.blocks[1].encode(), b"0" * 64)
    with pytest.raises(ManifestError, match="id does not match"):
        Manifest.from_json(tampered)


def test_upload_stores_each_distinct_block_once(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    f = tmp_path / "same.sqsh"
    f.write_bytes(b"\0" * (5 * BS))  # five identical blocks
    m = upload_file(store, str(f), BS, keys=KEYS)
    assert len(set(m.blocks)) == 1
    assert len(store.list("images/blocks", recursive=True)) == 1
    tag_image(store, "zeros:1", m, keys=KEYS)
    assert lookup_name(store, "zeros:1", keys=KEYS) == m
    with pytest.raises(ManifestError, match="no image named"):
        lookup_name(store, "zeros:2", keys=KEYS)


def test_path_image_registered_once_when_many_ask_at_once(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    f = sqsh_file(tmp_path / "p.sqsh", 40 * BS)
    st = f.stat()
    logs: list[str] = []
    with cf.ThreadPoolExecutor(8) as pool:
        got = list(
            pool.map(
                lambda _: register_path(store, str(f), st, BS, 30, logs.append, keys=KEYS), range(8)
            )
        )
    assert len({m.id for m in got}) == 1
    assert sum(line.startswith("registering") for line in logs) == 1
    assert not store.list("images/locks")
    # A changed file is a new image.
    f.write_bytes(b"hsqs" + b"x" * (10 * BS))
    assert register_path(store, str(f), f.stat(), BS, 30, keys=KEYS).id != got[0].id


def test_registration_lock_is_one_holders_and_breaks_when_stale(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    a, b = (
        RegistrationLock(store, "images/locks/x.lock"),
        RegistrationLock(store, "images/locks/x.lock"),
    )
    assert a.acquire() and not b.acquire() and not a.stale()
    holder = json.loads(store.read_bytes(a.key))
    assert holder["pid"] == os.getpid() and len(holder["token"]) == 32
    old = time.time() - 3600
    os.utime(tmp_path / "store" / a.key, (old, old))
    assert b.stale()
    a.release()
    assert b.acquire()


@pytest.mark.root
def test_check_image_file_refuses_what_the_user_cannot_read(tmp_path: Path) -> None:
    d = tmp_path / "private"
    d.mkdir(mode=0o700)
    f = sqsh_file(d / "x.sqsh", BS)
    f.chmod(0o644)
    with pytest.raises(StoreError, match="not searchable"):
        check_image_file(str(f), 4242, 4242)
    (tmp_path / "link").symlink_to(d)
    with pytest.raises(StoreError, match="not searchable"):
        check_image_file(str(tmp_path / "link" / "x.sqsh"), 4242, 4242)
    notsq = tmp_path / "n.img"
    notsq.write_bytes(b"nope")
    with pytest.raises(StoreError, match="not a squashfs"):
        check_image_file(str(notsq), 0, 0)


def test_registration_reads_the_checked_file_even_if_the_link_is_swapped(
    tmp_path: Path,
) -> None:
    """The user swaps the image link for a file only root may read right after the check:
    the agent registers what it checked, never the file the link now names."""
    store = open_store(f"file://{tmp_path}/store")
    mine = sqsh_file(tmp_path / "mine.sqsh", 3 * BS, seed=1)
    mine.chmod(0o644)
    secret = sqsh_file(tmp_path / "secret.sqsh", 3 * BS, seed=2)
    secret.chmod(0o600)
    link = tmp_path / "image.sqsh"
    link.symlink_to(mine)
    fd, st = open_image_file(str(link), os.getuid(), os.getgid())
    try:
        link.unlink()
        link.symlink_to(secret)
        got = register_path(store, str(link), st, BS, 5, read_from=f"/proc/self/fd/{fd}", keys=KEYS)
    finally:
        os.close(fd)
    assert got.id == hash_file(str(mine), BS).id != hash_file(str(secret), BS).id


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="opens as another user")
def test_a_directory_swapped_during_the_open_never_yields_a_file_the_user_cannot_reach(
    tmp_path: Path,
) -> None:
    """A user flips a directory on the image's path between her own and a link to one
    only root may enter, as fast as she can, while the agent opens the image for her job:
    every open either fails or is her file, never root's (the open happens as her)."""
    tmp_path.chmod(0o755)
    mine, away = tmp_path / "mine", tmp_path / "mine.away"
    mine.mkdir()
    os.chown(mine, 4242, 4242)
    theirs = tmp_path / "root-only"
    theirs.mkdir(mode=0o700)
    secret = sqsh_file(theirs / "x.sqsh", BS, seed=9)
    own = sqsh_file(mine / "x.sqsh", BS, seed=1)
    own.chmod(0o644)
    own_ino, secret_ino = own.stat().st_ino, secret.stat().st_ino
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            mine.rename(away)
            mine.symlink_to(theirs)
            mine.unlink()
            away.rename(mine)

    flipper = threading.Thread(target=flip)
    flipper.start()
    seen = []
    until = time.monotonic() + 3.0  # today's check-then-open loses within a fraction of that
    try:
        while time.monotonic() < until:
            try:
                fd, _st = open_image_file(str(mine / "x.sqsh"), 4242, 4242)
            except StoreError:
                continue
            seen.append(os.fstat(fd).st_ino)
            os.close(fd)
    finally:
        stop.set()
        flipper.join()
    assert secret_ino not in seen
    assert set(seen) <= {own_ino}


def test_cache_lru_prefers_unpinned_and_survives_restart(tmp_path: Path) -> None:
    cache = BlockCache(tmp_path / "c", cap_bytes=3 * 10)
    blocks = [bytes([i]) * 10 for i in range(5)]
    ds = [digest(b) for b in blocks]
    cache.pin([ds[0]])
    for d, b in zip(ds, blocks, strict=True):
        cache.put(d, b)
    assert ds[0] in cache and ds[1] not in cache and cache.bytes <= 30
    again = BlockCache(tmp_path / "c", cap_bytes=30)
    assert {d for d in ds if d in again} == {d for d in ds if d in cache}
    # A block damaged on disk is dropped on its first read after a restart.
    where = again.locate(ds[4])
    assert where is not None
    with open(where.path, "r+b") as f:
        f.seek(where.offset)
        f.write(b"x" * 10)
    assert again.read(ds[4], 0, 10) is None and ds[4] not in again
    assert again.read(ds[0], 2, 3) == blocks[0][2:5]


class CountingSource(FileSource):
    """A file source that records the blocks it is asked for, in order; a slow disk
    (``delay``), or one whose reads ``held(index, priority)`` names wait until the test
    lets them go (``go``)."""

    def __init__(
        self,
        path: str,
        delay: float = 0.0,
        held: Callable[[int, int], bool] = lambda index, priority: False,
    ) -> None:
        super().__init__(path)
        self.reads: list[int] = []
        self.delay = delay
        self.held = held
        self.lock = threading.Lock()
        self.go = threading.Event()

    def read_block(
        self, index: int, block_digest: str, offset: int, length: int, priority: int
    ) -> bytes:
        with self.lock:
            self.reads.append(index)
        if self.held(index, priority):
            assert self.go.wait(60), "the test never released the held reads"
        time.sleep(self.delay)  # a slow disk: allowed in a unit test
        return super().read_block(index, block_digest, offset, length, priority)


@pytest.mark.skipif(shutil.which("fincore") is None, reason="needs util-linux fincore")
def test_cache_writes_blocks_past_the_page_cache(tmp_path: Path) -> None:
    """A piece (a checkpoint unit of 4-8 MiB) is read once, by the daemon that asked or
    a peer's sendfile: filling fresh page-cache pages with it was the agent's biggest
    cost per byte receiving checkpoint units (docs/p2p.md, "Per byte")."""
    cache = BlockCache(tmp_path / "c", cap_bytes=1 << 30)
    data = os.urandom(4 << 20)
    cache.put(digest(data), data)
    buffered = tmp_path / "buffered"
    buffered.write_bytes(data)

    def cached(path: Path) -> int:
        out = subprocess.run(
            ["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        return int(out.split()[0])

    if cached(buffered) == 0:
        pytest.skip("this filesystem keeps no page cache for a buffered write either")
    where = cache.locate(digest(data))
    assert where is not None and cached(where.path) == 0
    assert cache.read(digest(data), 0, len(data)) == data


def test_fetcher_fetches_a_block_once_however_many_wait(tmp_path: Path) -> None:
    f = sqsh_file(tmp_path / "f.sqsh", 4 * BS)
    m = hash_file(str(f), BS)
    src = CountingSource(str(f), delay=0.2)
    fetcher = Fetcher(BlockCache(tmp_path / "c", 1 << 30), workers=8, timeout=60)
    try:
        with cf.ThreadPoolExecutor(16) as pool:
            out = list(pool.map(lambda _: fetcher.get(src, m, 2), range(16)))
        assert out == [f.read_bytes()[2 * BS : 3 * BS]] * 16
        assert src.reads == [2]
    finally:
        fetcher.stop()


def test_fetcher_refuses_a_block_that_does_not_match(tmp_path: Path) -> None:
    f = sqsh_file(tmp_path / "f.sqsh", 2 * BS)
    m = hash_file(str(f), BS)
    f.write_bytes(b"hsqs" + b"\1" * (2 * BS - 4))  # the source changed under the manifest
    cache = BlockCache(tmp_path / "c", 1 << 30)
    # Retried until the timeout: 3 s leaves room for several tries however late it starts.
    fetcher = Fetcher(cache, workers=2, timeout=3)
    try:
        with pytest.raises(FetchError, match="digest mismatch"):
            fetcher.get(FileSource(str(f)), m, 0)
        assert fetcher.stats.corrupt >= 2 and len(cache) == 0
    finally:
        fetcher.stop()


def test_background_fill_yields_to_demand_reads(tmp_path: Path) -> None:
    f = sqsh_file(tmp_path / "f.sqsh", 40 * BS)
    m = hash_file(str(f), BS)
    # The fill's read stays under way until the test lets it go.
    src = CountingSource(str(f), held=lambda index, priority: priority == BACKGROUND)
    fetcher = Fetcher(BlockCache(tmp_path / "c", 1 << 30), workers=4, background_workers=1)
    try:
        fill = BackgroundFill(m.id)
        fill.start(fetcher, src, m, skip=set())
        wait_until(lambda: src.reads == [0], "the fill's first read under way")
        fetcher.get(src, m, 39)  # last in the fill's order; a demand read jumps the queue
        assert src.reads == [0, 39]
        fill.cancel()
        src.go.set()
        # Every queued fetch of the fill settles (the cancelled ones are dropped unread).
        wait_until(lambda: fill.ended is not None, "the cancelled fill's end")
        assert fill.state == "cancelled" and src.reads == [0, 39]
    finally:
        src.go.set()
        fetcher.stop()


def test_prefetch_hot_follows_trace_order(tmp_path: Path) -> None:
    f = sqsh_file(tmp_path / "f.sqsh", 10 * BS)
    m = hash_file(str(f), BS)
    src = CountingSource(str(f))
    fetcher = Fetcher(BlockCache(tmp_path / "c", 1 << 30), workers=1)
    try:
        res = prefetch_hot(fetcher, src, m, [7, 2, 5], time.monotonic() + 60)
        assert src.reads == [7, 2, 5] and res.complete and res.fetched_blocks == 3
        res = prefetch_hot(fetcher, src, m, [7, 2, 5, 1], time.monotonic() + 60)
        assert res.local_before == 3 and res.hit_ratio == 0.75
    finally:
        fetcher.stop()


def test_prefetch_may_return_once_the_leading_part_is_local(tmp_path: Path) -> None:
    f = sqsh_file(tmp_path / "f.sqsh", 8 * BS)
    m = hash_file(str(f), BS)
    src = CountingSource(str(f), held=lambda index, priority: index >= 2)  # all but the lead
    fetcher = Fetcher(BlockCache(tmp_path / "c", 1 << 30), workers=1)
    try:
        res = prefetch_hot(fetcher, src, m, list(range(8)), time.monotonic() + 60, 0.25)
        assert res.fetched_blocks == 2 and not res.complete
        src.go.set()
        wait_until(lambda: len(src.reads) >= 8, "the rest of the trace fetched")
        assert src.reads == list(range(8))  # the rest streamed on, in trace order
    finally:
        src.go.set()
        fetcher.stop()


@pytest.mark.parametrize(
    ("blocks", "message"),
    [((0, 99), "outside the image"), ((1, 1), "twice"), ((-1,), "outside the image")],
)
def test_trace_validation(blocks: tuple[int, ...], message: str) -> None:
    image = "a" * 64
    raw = Trace(image, 10, BS, blocks).to_json()
    with pytest.raises(TraceError, match=message):
        Trace.from_json(raw, image, 10, BS)


def test_trace_checksum_image_and_size_are_checked() -> None:
    image = "a" * 64
    raw = Trace(image, 10, BS, (1, 2)).to_json()
    with pytest.raises(TraceError, match="checksum"):
        Trace.from_json(raw.replace(b"[1,2]", b"[1,3]"), image, 10, BS)
    with pytest.raises(TraceError, match="is for image"):
        Trace.from_json(raw, "b" * 64, 10, BS)
    with pytest.raises(TraceError, match="blocks of"):
        Trace.from_json(raw, image, 11, BS)
    assert Trace(image, 10, BS, (1, 2)).merged([2, 1]) is None
    assert Trace(image, 10, BS, (1, 2)).merged([4, 2, 3]) == Trace(image, 10, BS, (1, 2, 4, 3), 2)


def test_recorder_keeps_first_access_order_until_stopped() -> None:
    r = Recorder(10, window=60)
    r.record(3, 4)
    r.record(0, 0)
    r.record(3, 3)
    r.stop()
    r.record(9, 9)
    assert r.order == [3, 4, 0]
    late = Recorder(10, window=0)
    late.record(1, 1)
    assert late.order == []


def test_image_config_section_and_node_paths() -> None:
    cfg = SiteConfig.from_mapping(
        {"image": {"socket": "/run/%n/a.sock", "cache_size_gib": 2, "prefetch_parallel": 8}}
    )
    node = cfg.for_node("n3")
    assert str(node.image.socket) == "/run/n3/a.sock" and node.image.prefetch_parallel == 8
    with pytest.raises(ConfigError, match=r"image\.prefetch"):
        SiteConfig.from_mapping({"image": {"prefetch": 3}})


def test_gc_deletes_what_no_name_reaches_and_keeps_shared_blocks(tmp_path: Path) -> None:
    from bootseer.image.gc import collect
    from bootseer.image.registry import remove_name

    store = open_store(f"file://{tmp_path}/store")
    shared = os.urandom(BS)
    a, b = tmp_path / "a.sqsh", tmp_path / "b.sqsh"
    a.write_bytes(shared + b"a" * BS)
    b.write_bytes(shared + b"b" * BS)
    ma, mb = upload_file(store, str(a), BS, keys=KEYS), upload_file(store, str(b), BS, keys=KEYS)
    tag_image(store, "a:1", ma, keys=KEYS)
    tag_image(store, "b:1", mb, keys=KEYS)
    assert collect(store, grace=0).blocks == 0
    remove_name(store, "a:1")
    assert collect(store, grace=3600, dry_run=True).blocks == 0  # young objects are kept
    report = collect(store, grace=0)
    assert (report.manifests, report.blocks) == (1, 1)
    assert lookup_name(store, "b:1", keys=KEYS) == mb
    assert len(store.list("images/blocks", recursive=True)) == 2


def test_gc_deletes_no_block_while_a_manifest_in_use_cannot_be_read(tmp_path: Path) -> None:
    """A live image whose manifest gc cannot read (here: a format from a later release)
    names blocks gc cannot see: it keeps every block, says which image and why, and the
    command fails; the next gc that can read it collects as usual."""
    from bootseer.image.gc import collect
    from bootseer.image.manifest import manifest_key
    from bootseer.image.registry import remove_name

    store = open_store(f"file://{tmp_path}/store")
    a, b = tmp_path / "a.sqsh", tmp_path / "b.sqsh"
    a.write_bytes(os.urandom(2 * BS))
    b.write_bytes(os.urandom(BS))
    ma, mb = upload_file(store, str(a), BS, keys=KEYS), upload_file(store, str(b), BS, keys=KEYS)
    tag_image(store, "a:1", ma, keys=KEYS)
    tag_image(store, "b:1", mb, keys=KEYS)
    remove_name(store, "b:1")  # b's block is garbage
    key = manifest_key(ma.id)
    good = store.read_bytes(key)
    doc = json.loads(good)
    doc["format"] = "bootseer-image/9"
    store.write_bytes(key, json.dumps(doc).encode())
    report = collect(store, grace=0)
    assert report.blocks == 0 and report.kept_blocks == 3
    assert [i for i, _ in report.unreadable] == [ma.id]
    assert "bootseer-image/9" in report.unreadable[0][1]
    assert len(store.list("images/blocks", recursive=True)) == 3
    store.write_bytes(key, good)
    report = collect(store, grace=0)
    assert (report.blocks, report.unreadable) == (1, [])
    assert len(store.list("images/blocks", recursive=True)) == 2


def test_an_image_added_before_blake3_is_still_read_checked_and_collected(
    tmp_path: Path,
) -> None:
    """A store written by the release before: a ``bootseer-image/1`` manifest naming
    SHA-256 blocks, stored where they always were. Its id, blocks and name still hold; its
    blocks are fetched and checked by SHA-256 (a damaged one refused); an image added now
    is ``/2``, BLAKE3 blocks under ``images/blocks/blake3/``; gc tells both apart."""
    from bootseer.image.gc import collect
    from bootseer.image.manifest import FORMAT_SHA256, save_manifest
    from bootseer.image.registry import remove_name

    store = open_store(f"file://{tmp_path}/store")
    data = os.urandom(3 * BS)
    shas = [hashlib.sha256(data[i : i + BS]).hexdigest() for i in range(0, len(data), BS)]
    for i, d in enumerate(shas):
        store.write_bytes(f"images/blocks/{d[:2]}/{d}", data[i * BS : (i + 1) * BS])
    old_id = hashlib.sha256(
        f"bootseer-image/1 {len(data)} {BS}\n".encode() + b"".join(d.encode() + b"\n" for d in shas)
    ).hexdigest()
    old = Manifest(len(data), BS, tuple(shas), format=FORMAT_SHA256)
    assert old.id == old_id  # the id the release before gave it
    save_manifest(store, old, keys=KEYS)
    tag_image(store, "old:1", old, keys=KEYS)
    assert lookup_name(store, "old:1", keys=KEYS) == old
    assert json.loads(old.to_json())["format"] == "bootseer-image/1"
    fetcher = Fetcher(BlockCache(tmp_path / "c", 1 << 30), workers=2, timeout=3)
    try:
        assert fetcher.get(StoreSource(store), old, 1) == data[BS : 2 * BS]
        store.write_bytes(f"images/blocks/{shas[2][:2]}/{shas[2]}", b"\0" * BS)  # damaged
        with pytest.raises(FetchError, match="digest mismatch"):
            fetcher.get(StoreSource(store), old, 2)
    finally:
        fetcher.stop()
    # A /1 manifest naming a BLAKE3 block is none the release before wrote: refused.
    forged = old.to_json().replace(shas[0].encode(), digest(data[:BS]).encode())
    with pytest.raises(ManifestError, match="not SHA-256"):
        Manifest.from_json(forged)
    f = tmp_path / "same.sqsh"
    f.write_bytes(data)
    new = upload_file(store, str(f), BS, keys=KEYS)
    assert new.format == "bootseer-image/2" and new.id != old.id
    assert all(d.startswith("blake3:") for d in new.blocks)
    tag_image(store, "new:1", new, keys=KEYS)
    keys_now = {o.key for o in store.list("images/blocks", recursive=True)}
    assert len(keys_now) == 6 and sum("/blake3/" in k for k in keys_now) == 3
    assert collect(store, grace=0).blocks == 0
    remove_name(store, "old:1")
    report = collect(store, grace=0)
    assert (report.manifests, report.blocks) == (1, 3)
    left = {o.key for o in store.list("images/blocks", recursive=True)}
    assert left == {k for k in keys_now if "/blake3/" in k}
    assert lookup_name(store, "new:1", keys=KEYS) == new


def test_the_background_fill_is_paced_to_its_rate(tmp_path: Path) -> None:
    """background_bps caps the fill's average rate (here 4 blocks a second)."""
    f = sqsh_file(tmp_path / "f.sqsh", 9 * BS)
    m = hash_file(str(f), BS)
    src = CountingSource(str(f))
    fetcher = Fetcher(
        BlockCache(tmp_path / "c", 1 << 30),
        workers=4,
        background_workers=2,
        timeout=10,
        quiet=0.0,
        read_quiet=0.0,
        background_bps=4 * BS,
    )
    try:
        t0 = time.monotonic()
        futures = [fetcher.request(src, m, i, BACKGROUND) for i in range(9)]
        for fut in futures:
            fut.result(timeout=10)
        # 9 blocks at 4 a second: the pacer lets the first go at once, the ninth at 2 s.
        assert time.monotonic() - t0 >= 1.9
    finally:
        fetcher.stop()


def test_a_new_fetcher_has_seen_no_read_however_new_the_machine(tmp_path: Path) -> None:
    """No job has read yet, so the fill starts at once: whatever read_quiet (here longer
    than any machine's uptime, which time.monotonic() counts), "never" is longer ago."""
    f = sqsh_file(tmp_path / "f.sqsh", 2 * BS)
    m = hash_file(str(f), BS)
    src = CountingSource(str(f))
    fetcher = Fetcher(BlockCache(tmp_path / "c", 1 << 30), timeout=10, quiet=1e12, read_quiet=1e12)
    try:
        fetcher.request(src, m, 1, BACKGROUND).result(timeout=30)
        assert src.reads == [1]
    finally:
        fetcher.stop()


def test_a_demand_read_is_served_while_the_pacer_holds_the_fill(tmp_path: Path) -> None:
    """The pacer holds background fetches only: with the fill's next block an hour away,
    a demand read of a block nobody fetched yet is served (and stop() ends the wait)."""
    f = sqsh_file(tmp_path / "f.sqsh", 9 * BS)
    m = hash_file(str(f), BS)
    src = CountingSource(str(f))
    fetcher = Fetcher(
        BlockCache(tmp_path / "c", 1 << 30),
        workers=4,
        background_workers=1,
        timeout=10,
        quiet=0.0,
        read_quiet=0.0,
        background_bps=BS / 3600,
    )
    try:
        fill = [fetcher.request(src, m, i, BACKGROUND) for i in range(2)]
        fill[0].result(timeout=30)  # the first goes at once; the second waits its hour
        assert fetcher.get(src, m, 8) == f.read_bytes()[8 * BS : 9 * BS]
        assert src.reads == [0, 8] and not fill[1].done()
    finally:
        fetcher.stop()
    with pytest.raises(FetchError, match="stopped"):
        fill[1].result(timeout=30)


def one_job(
    tmp_path: Path, size: int, fetcher_of: Callable[[BlockCache], Fetcher]
) -> tuple[Path, Manifest, CountingSource, BlockCache, Fetcher, Jobs]:
    """An agent's jobs with one, job 7, of an image of ``size`` bytes read from a
    counting source, its blocks cached in ``tmp_path`` by the fetcher ``fetcher_of``
    makes: what a peer's request to this node meets."""
    from bootseer.agent.jobs import Jobs, JobView, PreparedImage
    from bootseer.nodepaths import NodePaths

    f = sqsh_file(tmp_path / "f.sqsh", size)
    m = hash_file(str(f), BS)
    src = CountingSource(str(f))
    cache = BlockCache(tmp_path / "c", 1 << 30)
    fetcher = fetcher_of(cache)
    cfg = SiteConfig.from_mapping({"image": {"cache_dir": str(tmp_path / "i")}})
    store = open_store(f"file://{tmp_path}/s")
    jobs = Jobs(cfg.image, NodePaths(cfg), store, cache, fetcher, BS, print, keys=lambda: KEYS)
    jobs._add(JobView(7, 0, 0, PreparedImage(m, src, str(f)), Recorder(m.nblocks, 0)))
    return f, m, src, cache, fetcher, jobs


def test_a_peers_fill_request_waits_for_the_owners_own_start(tmp_path: Path) -> None:
    """The owner serves a peer's fill at the fill's priority: while its own job reads,
    the block is not fetched for the peer (it was, at prefetch priority, during startup)."""
    from bootseer.p2p.wire import PieceRequest

    # The owner's own job is reading: its last read is within read_quiet (an hour here,
    # so a test thread the machine leaves waiting cannot end the reading by accident).
    _, m, src, _, fetcher, jobs = one_job(
        tmp_path,
        4 * BS,
        lambda c: Fetcher(c, workers=4, timeout=60, quiet=0.05, read_quiet=3600.0),
    )
    fetcher.last_read = time.monotonic()
    try:
        got: list[object] = []  # bytes (a run's blocks for a run)
        asked = threading.Thread(
            target=lambda: got.append(
                jobs.provide_block(
                    PieceRequest(7, "", m.blocks[2], BACKGROUND, trees=TREES),
                    time.monotonic() + 60,
                )
            )
        )
        asked.start()
        # The owner's job reads for 1.5 s: the behaviour under test (the peer's fetch
        # waits all that time), not a synchronisation.
        time.sleep(1.5)
        assert src.reads == [] and asked.is_alive()
        fetcher.last_read = NEVER  # the job's reads end: the peer's block is fetched
        asked.join(timeout=60)
        assert (
            got and isinstance(got[0], bytes) and digest(got[0]) == m.blocks[2] and src.reads == [2]
        )
    finally:
        fetcher.stop()


def test_a_peers_request_that_times_out_says_so(tmp_path: Path) -> None:
    """The owner's job reads all along, so the peer's fill request gets no block before
    its deadline: the error says it timed out and after how long (the future's
    TimeoutError has no message; "block 2 of job 7: " was all a peer once heard)."""
    from bootseer.p2p.wire import PeerError, PieceRequest

    _, m, src, _cache, fetcher, jobs = one_job(
        tmp_path, 4 * BS, lambda c: Fetcher(c, workers=4, timeout=60, quiet=0.05, read_quiet=3600.0)
    )
    fetcher.last_read = time.monotonic()
    try:
        ask = PieceRequest(7, "", m.blocks[2], BACKGROUND, trees=TREES)
        with pytest.raises(PeerError) as got:
            jobs.provide_block(ask, time.monotonic() + 0.5)
        assert got.value.kind == "failed"
        assert str(got.value).startswith("block 2 of job 7: timed out after 0.")
        assert str(got.value).endswith(" s (TimeoutError)") and src.reads == []
    finally:
        fetcher.stop()


def test_a_peer_is_sent_only_a_held_block_of_the_jobs_image(tmp_path: Path) -> None:
    """``held_block`` (the peer server's sendfile path) names where the cache holds a block
    of the job's image that this node holds (its pack, offset and length); a block it does not
    hold, a piece of no block of the image and an unknown job go to ``provide_block``."""
    from bootseer.p2p.server import HeldPiece
    from bootseer.p2p.wire import PieceRequest

    f, m, _src, cache, fetcher, jobs = one_job(
        tmp_path, 3 * BS + 100, lambda c: Fetcher(c, workers=1, timeout=60)
    )
    try:
        data = f.read_bytes()
        cache.put(m.blocks[3], data[3 * BS :])
        held = jobs.held_block(PieceRequest(7, "", m.blocks[3], 1))
        assert isinstance(held, HeldPiece) and held.size == 100
        with open(held.path, "rb") as pack:
            assert os.pread(pack.fileno(), 100, held.offset) == data[3 * BS :]
        assert jobs.held_block(PieceRequest(7, "", m.blocks[1], 1)) is None  # not held
        other = digest(b"not a block of the image")
        cache.put(other, b"not a block of the image")
        assert jobs.held_block(PieceRequest(7, "", other, 1)) is None  # not the job's
        assert jobs.held_block(PieceRequest(8, "", m.blocks[3], 1)) is None  # no such job
    finally:
        fetcher.stop()


def test_a_run_is_served_only_of_the_jobs_image_held_or_fetched(tmp_path: Path) -> None:
    """A run request (blocks by index, its digest theirs): every block held goes the
    sendfile way, a run with a block not held is provided (fetched from the job's
    source), one whose digest does not name its blocks (another image) is "missing"."""
    from bootseer.p2p.wire import PeerError, PieceRequest, run_digest

    f, m, src, cache, fetcher, jobs = one_job(
        tmp_path, 3 * BS + 100, lambda c: Fetcher(c, workers=2, timeout=60)
    )
    data = f.read_bytes()

    def run(*blocks: int) -> PieceRequest:
        digest_ = run_digest([m.blocks[i] for i in blocks])
        return PieceRequest(7, "", digest_, 1, blocks=blocks, trees=TREES)

    try:
        cache.put(m.blocks[1], data[BS : 2 * BS])
        cache.put(m.blocks[3], data[3 * BS :])
        held = jobs.held_block(run(1, 3))
        assert isinstance(held, list) and [h.size for h in held] == [BS, 100]
        assert jobs.held_block(run(1, 2)) is None  # block 2 not held: provided
        got = jobs.provide_block(run(1, 2), time.monotonic() + 60)
        assert got == [data[BS : 2 * BS], data[2 * BS : 3 * BS]] and src.reads == [2]
        wrong = PieceRequest(7, "", run_digest([m.blocks[0]]), 1, blocks=(1,), trees=TREES)
        assert jobs.held_block(wrong) is None
        with pytest.raises(PeerError, match="not a run"):
            jobs.provide_block(wrong, time.monotonic() + 60)
        with pytest.raises(PeerError, match="not a run"):  # past the image's end
            jobs.provide_block(
                PieceRequest(7, "", run_digest([m.blocks[0]]), 1, blocks=(99,), trees=TREES),
                time.monotonic() + 60,
            )
    finally:
        fetcher.stop()


def test_an_asker_under_other_trees_is_served_only_what_is_held(tmp_path: Path) -> None:
    """An agent of an older version finds a block's tree by its digest, this one by its
    range (bootseer.p2p.owner): each could take the other for the node above it and
    wait on it while it waits back. Its requests (no ``trees``) get the blocks held
    here and nothing fetched for them: a block not held is "failed" (no node dropped;
    the asker goes to the store), a run has the held ones and no other."""
    from bootseer.p2p.wire import PeerError, PieceRequest, run_digest

    f, m, src, cache, fetcher, jobs = one_job(
        tmp_path, 3 * BS + 100, lambda c: Fetcher(c, workers=2, timeout=60)
    )
    data = f.read_bytes()
    try:
        cache.put(m.blocks[1], data[BS : 2 * BS])
        old = PieceRequest(7, "", m.blocks[1], 1)
        assert jobs.provide_block(old, time.monotonic() + 60) == data[BS : 2 * BS]
        with pytest.raises(PeerError) as got:
            jobs.provide_block(PieceRequest(7, "", m.blocks[2], 1), time.monotonic() + 60)
        assert got.value.kind == "failed" and "other trees" in str(got.value)
        run = PieceRequest(7, "", run_digest([m.blocks[1], m.blocks[2]]), 1, blocks=(1, 2))
        assert jobs.provide_block(run, time.monotonic() + 60) == [data[BS : 2 * BS], None]
        assert src.reads == []  # nothing fetched for it
        # The same asked under this version's trees: fetched.
        new = PieceRequest(7, "", m.blocks[2], 1, trees=TREES)
        assert jobs.provide_block(new, time.monotonic() + 60) == data[2 * BS : 3 * BS]
        assert src.reads == [2]
    finally:
        fetcher.stop()
