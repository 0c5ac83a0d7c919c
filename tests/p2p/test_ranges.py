"""An image block's tree is its range's (bootseer.p2p.owner.range_owner_index), and in a
job of several nodes the blocks a node reads from the store itself come from the hot
set's bundles, one ranged read per stretch (bootseer.image.bundles), as a one-node
job's do: no block read alone, none from a peer that the node should have read.

Two nodes on loopback, as in test_runs: n1 serves the job's image as the agent does
(its cache, fetcher and a real file store), n2 prefetches through :class:`PeerSource`
with the image's manifest and its bundles.
"""

from __future__ import annotations

import itertools
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bootseer.image.bundles import BundleSource, index, write_bundles
from bootseer.image.cache import BlockCache
from bootseer.image.fetch import Fetcher, StoreSource
from bootseer.image.manifest import Manifest, hash_file, upload_file
from bootseer.image.prefetch import prefetch_hot
from bootseer.image.trace import Trace
from bootseer.p2p.imagesource import PeerSource
from bootseer.p2p.owner import RANGE_BYTES, range_owner_index
from bootseer.p2p.server import PeerServer, ServedJob
from bootseer.store import open_store
from tests.p2p.test_peers import LOOPBACK, TIMEOUT, serve, swarm_to
from tests.p2p.test_runs import RUN, CountingStore, Node1
from tests.sitekeys import KEYS

__all__ = ["serve"]  # the fixture

BS = 64 << 10
PER_RANGE = RANGE_BYTES // BS  # 16 blocks
RANGES = 8  # in the image: 128 blocks


def test_an_images_ranges_are_spread_over_the_nodes() -> None:
    """Every block of a range has one owner; the ranges' owners are spread evenly, and
    adjacent ranges are not rooted at adjacent nodes (at 10,000 nodes the nodes just
    past a run of roots would send every range on several times)."""
    image = "ab" * 32
    n = 5
    owners = [range_owner_index(image, i, BS, n) for i in range(1000 * PER_RANGE)]
    for r in range(1000):
        assert set(owners[r * PER_RANGE : (r + 1) * PER_RANGE]) == {owners[r * PER_RANGE]}
    per_node = Counter(owners[::PER_RANGE])
    assert len(per_node) == n and all(150 <= c <= 250 for c in per_node.values())
    big = [range_owner_index(image, r * PER_RANGE, BS, 10_000) for r in range(300)]
    steps = Counter((b - a) % 10_000 for a, b in itertools.pairwise(big))
    assert steps.most_common(1)[0][1] <= 3
    # Blocks of 256 KiB: 4 a range; of 1 MiB: one each. A range is one whatever cuts it.
    assert len({range_owner_index(image, i, 256 << 10, 1000) for i in range(4)}) == 1
    assert range_owner_index(image, 4, 256 << 10, 1000) == range_owner_index(
        image, 1, 1 << 20, 1000
    )


@pytest.fixture
def bundled_image(tmp_path: Path) -> tuple[CountingStore, Manifest, bytes, Trace]:
    """Eight ranges of blocks in the store (128 of 64 KiB), half owned by each of the
    job's two nodes, the whole image the hot set, its trace bundled in bundles of 32
    blocks (two ranges: a node's stretches in a bundle are of one range or two)."""
    store = open_store(f"file://{tmp_path}/store")
    while True:  # an image whose ranges the two nodes own half each (27% of them)
        data = os.urandom(RANGES * RANGE_BYTES)
        (tmp_path / "img").write_bytes(data)
        m = hash_file(str(tmp_path / "img"), BS)
        owners = [range_owner_index(m.id, r * PER_RANGE, BS, 2) for r in range(RANGES)]
        if sum(owners) == RANGES // 2:
            break
    m = upload_file(store, str(tmp_path / "img"), BS, keys=KEYS)
    by_digest = {d: data[i * BS : (i + 1) * BS] for i, d in enumerate(m.blocks)}
    trace = Trace(m.id, m.nblocks, BS, tuple(range(m.nblocks)))
    done = write_bundles(store, m, trace, 32, lambda d, n: by_digest.get(d), 1 << 30)
    assert done.written == 4
    return CountingStore(store), m, data, trace.with_bundles(32, done.bundles)


@pytest.fixture
def n1_serving(
    serve: Callable[..., PeerServer],
    tmp_path: Path,
    bundled_image: tuple[CountingStore, Manifest, bytes, Trace],
) -> Iterator[tuple[Node1, PeerServer]]:
    """n1, serving the job's image from its cache, fetching (from the store) what it
    does not hold."""
    store, m, _, _ = bundled_image
    fetcher = Fetcher(BlockCache(tmp_path / "n1", 1 << 30), workers=8, timeout=TIMEOUT)
    n1 = Node1(fetcher.cache, fetcher, StoreSource(store.store), m)
    try:
        yield n1, serve({42: ServedJob(LOOPBACK, n1.provide, n1.held)})
    finally:
        fetcher.stop()


@pytest.fixture
def n2_fetcher(tmp_path: Path) -> Iterator[Fetcher]:
    fetcher = Fetcher(BlockCache(tmp_path / "n2", 1 << 30), workers=4, timeout=TIMEOUT)
    try:
        yield fetcher
    finally:
        fetcher.stop()


def test_a_node_reads_the_ranges_it_owns_from_bundles_and_the_rest_from_its_peer(
    bundled_image: tuple[CountingStore, Manifest, bytes, Trace],
    n1_serving: tuple[Node1, PeerServer],
    n2_fetcher: Fetcher,
) -> None:
    store, m, data, trace = bundled_image
    n1, server = n1_serving
    swarm = swarm_to(server.port, timeout=TIMEOUT)
    bundles = BundleSource(store, index(m, [trace]))
    source = PeerSource(store, swarm, m, bundles)
    deadline = time.monotonic() + TIMEOUT
    res = prefetch_hot(n2_fetcher, source, m, trace.blocks, deadline, 1.0, RUN)
    assert res.complete and res.fetched_blocks == m.nblocks
    for i, d in enumerate(m.blocks):
        assert n2_fetcher.cache.read(d, 0, BS) == data[i * BS : (i + 1) * BS]
    mine = {i for i in range(m.nblocks) if range_owner_index(m.id, i, BS, 2) == 1}
    assert len(mine) == RANGES // 2 * PER_RANGE  # half the ranges each
    # n2's ranges: from its bundles, one read per stretch of them in a bundle (of 8
    # blocks at most, the run's size); no block read alone, none asked of n1.
    assert store.read == []
    stretches = sum(
        1 for i in sorted(mine) if i % 8 == 0 or i - 1 not in mine
    )  # where a read starts: a run's bound, or a range after n1's
    assert (bundles.stats.blocks, bundles.stats.reads) == (len(mine), stretches)
    asked = [i for r in n1.requests for i in r.blocks]
    assert sorted(asked) == sorted(set(range(m.nblocks)) - mine)
    assert all(r.blocks and r.trees for r in n1.requests)  # runs, under range trees
    half = RANGES // 2 * PER_RANGE * BS
    assert source.counts() == (half, half)
    assert swarm.stats.store_bytes == half and not swarm.stats.dropped


def test_without_bundles_a_node_reads_its_ranges_block_by_block(
    bundled_image: tuple[CountingStore, Manifest, bytes, Trace],
    n1_serving: tuple[Node1, PeerServer],
    n2_fetcher: Fetcher,
) -> None:
    """The same trees without bundles (none named, or ``bundle_kib = 0``): n2's range
    from the store a block at a time, n1's from n1 in runs."""
    store, m, _, trace = bundled_image
    n1, server = n1_serving
    source = PeerSource(store, swarm_to(server.port, timeout=TIMEOUT), m)
    deadline = time.monotonic() + TIMEOUT
    assert prefetch_hot(n2_fetcher, source, m, trace.blocks, deadline, 1.0, RUN).complete
    mine = [d for i, d in enumerate(m.blocks) if range_owner_index(m.id, i, BS, 2) == 1]
    assert sorted(store.read) == sorted(mine)
    assert n1.requests and all(r.blocks for r in n1.requests)  # n1's blocks in runs


def test_a_block_the_image_holds_twice_has_the_tree_of_its_first_place(
    serve: Callable[..., PeerServer],
) -> None:
    """Zeros at the image's start and end: one digest, one tree (its first place's),
    whichever place asked for it; a digest that is no block of the image has none."""
    zero = "00" * 32
    for salt in itertools.count():  # an image whose two ranges have two owners
        middle = [f"{salt:032x}{i:032x}" for i in range(1, 2 * PER_RANGE - 1)]
        m = Manifest(2 * RANGE_BYTES, BS, (zero, *middle, zero))  # two ranges
        if range_owner_index(m.id, 0, BS, 2) != range_owner_index(m.id, PER_RANGE, BS, 2):
            break
    source = PeerSource(StoreSource(open_store("file:///nonexistent")), swarm_to(1), m)
    assert source.root(zero) == range_owner_index(m.id, 0, BS, 2)
    assert source.root(m.blocks[-2]) == range_owner_index(m.id, PER_RANGE, BS, 2)
    assert source.root(zero) != source.root(m.blocks[-2])  # the last place's tree: not zero's
    assert source.root("ff" * 32) is None
