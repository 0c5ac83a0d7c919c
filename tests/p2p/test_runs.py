"""The image's hot set in runs (issue 19): the blocks a node gets from one peer asked in
one request per run, each block checked by its own digest, a bad one failing only
itself, an agent of the previous version (no runs) still serving block by block, and a
reader's miss never waiting behind a queued run.

Two nodes on loopback: n1 serves its job's image as the agent does (the agent's own
``held_run``/``provide_run`` over its block cache, fetcher and a real file store), n2
prefetches through :class:`PeerSource` and its own fetcher and cache.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bootseer import digest
from bootseer.image.blocks import block_key
from bootseer.image.cache import BlockCache
from bootseer.image.fetch import DEMAND, PREFETCH, Fetcher, StoreSource
from bootseer.image.manifest import Manifest
from bootseer.image.prefetch import prefetch_hot
from bootseer.p2p.imagesource import PeerSource, held_run, provide_run
from bootseer.p2p.owner import owner
from bootseer.p2p.server import HeldPiece, PeerServer, RunBlocks, ServedJob
from bootseer.p2p.wire import MAX_RUN, PeerError, PieceReply, PieceRequest, run_digest
from bootseer.store import Store, open_store
from tests.p2p.test_peers import LOOPBACK, TIMEOUT, provider, serve, swarm_to
from tests.waiting import wait_until

__all__ = ["serve"]  # the fixture, shared with test_peers

BS = 64 << 10
RUN = 8 * BS  # runs of 8 blocks


def image_of_n1(store: Store, n: int) -> tuple[Manifest, dict[str, bytes]]:
    """An image of ``n`` distinct blocks (named by BLAKE3, as an image added now is),
    every one owned by n1 (so n2 asks n1 for all), its blocks in the store."""
    blocks: dict[str, bytes] = {}
    while len(blocks) < n:
        data = os.urandom(BS)
        d = digest.of(data)
        if owner(d, ("n1", "n2")) == "n1":
            blocks[d] = data
            store.write_bytes(block_key(d), data)
    return Manifest(n * BS, BS, tuple(blocks)), blocks


class CountingStore(StoreSource):
    """The real file store, noting each block read from it."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.read: list[str] = []

    def read_block(self, index: int, digest: str, offset: int, length: int, prio: int) -> bytes:
        self.read.append(digest)
        return super().read_block(index, digest, offset, length, prio)


@dataclass
class Node1:
    """n1 as its agent serves the job's image: held blocks from their files, the rest
    fetched (from the store: n1 owns them) and provided; every request noted."""

    cache: BlockCache
    fetcher: Fetcher
    source: StoreSource
    manifest: Manifest
    requests: list[PieceRequest] = field(default_factory=list)
    hold: threading.Event = field(default_factory=threading.Event)  # set: answer runs
    _seen: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.hold.set()

    def _note(self, req: PieceRequest) -> None:
        if req.tag not in self._seen:  # held first, then provided: one request
            self._seen.add(req.tag)
            self.requests.append(req)

    def held(self, req: PieceRequest) -> HeldPiece | list[HeldPiece] | None:
        self._note(req)
        if req.blocks:
            return held_run(self.cache, self.manifest, req) if self.hold.is_set() else None
        where = self.cache.locate(req.piece)
        if where is None:
            return None
        return HeldPiece(where.path, where.size, where.offset)

    def provide(self, req: PieceRequest, deadline: float) -> bytes | memoryview | RunBlocks:
        self._note(req)
        if req.blocks:
            assert self.hold.wait(TIMEOUT)
            return provide_run(self.fetcher, self.source, self.manifest, req, deadline, RUN)
        i = self.manifest.blocks.index(req.piece)
        return self.fetcher.request(self.source, self.manifest, i, PREFETCH).result(TIMEOUT)

    def runs(self) -> list[int]:
        """Each request's block count (0: a block asked alone), in the order they came."""
        return [len(r.blocks) for r in self.requests]


@pytest.fixture
def nodes(
    serve: Callable[..., PeerServer], tmp_path: Path
) -> Iterator[Callable[[int], tuple[Node1, PeerServer, dict[str, bytes]]]]:
    fetchers: list[Fetcher] = []
    store = open_store(f"file://{tmp_path}/store")

    def make(n: int) -> tuple[Node1, PeerServer, dict[str, bytes]]:
        manifest, blocks = image_of_n1(store, n)
        fetcher = Fetcher(BlockCache(tmp_path / "n1", 1 << 30), workers=8, timeout=TIMEOUT)
        fetchers.append(fetcher)
        n1 = Node1(fetcher.cache, fetcher, StoreSource(store), manifest)
        server = serve({42: ServedJob(LOOPBACK, n1.provide, n1.held)})
        return n1, server, blocks

    yield make
    for f in fetchers:
        f.stop()


@pytest.fixture
def asker(tmp_path: Path) -> Iterator[Callable[[int, int], tuple[Fetcher, PeerSource]]]:
    """n2: its fetcher, cache and peer source (the real store behind, counted)."""
    fetchers: list[Fetcher] = []

    def make(port: int, workers: int = 4) -> tuple[Fetcher, PeerSource]:
        fetcher = Fetcher(BlockCache(tmp_path / "n2", 1 << 30), workers=workers, timeout=TIMEOUT)
        fetchers.append(fetcher)
        store = CountingStore(open_store(f"file://{tmp_path}/store"))
        return fetcher, PeerSource(store, swarm_to(port, timeout=TIMEOUT))

    yield make
    for f in fetchers:
        f.stop()


def holds_exactly(cache: BlockCache, blocks: dict[str, bytes]) -> bool:
    return all(cache.read(d, 0, len(b)) == b for d, b in blocks.items())


def test_a_run_is_asked_as_one_request_and_each_block_checked(nodes, asker) -> None:  # type: ignore[no-untyped-def]
    n1, server, blocks = nodes(24)
    fetcher, source = asker(server.port)
    order = list(range(24))
    res = prefetch_hot(fetcher, source, n1.manifest, order, time.monotonic() + TIMEOUT, 1.0, RUN)
    assert res.complete and res.fetched_blocks == 24
    assert n1.runs() == [8, 8, 8]  # three requests, not 24
    assert holds_exactly(fetcher.cache, blocks)
    assert fetcher.stats.runs == 3 and fetcher.stats.run_blocks == 24
    assert source.counts() == (0, 24 * BS) and source.origin.read == []  # type: ignore[attr-defined]
    assert source.swarm.stats.runs == 3 and not source.swarm.stats.dropped
    # Without runs (prefetch_run_kib = 0), the same hot set is one request per block.
    n1b, server_b, blocks_b = nodes(6)
    fetcher_b, source_b = asker(server_b.port)
    prefetch_hot(fetcher_b, source_b, n1b.manifest, range(6), time.monotonic() + TIMEOUT, 1.0, 0)
    assert n1b.runs() == [0] * 6 and holds_exactly(fetcher_b.cache, blocks_b)


def test_a_run_with_a_bad_block_keeps_the_good_ones_and_gets_it_elsewhere(nodes, asker) -> None:  # type: ignore[no-untyped-def]
    """n1 holds the run's blocks, one of its cache files damaged (sendfile does not look):
    n2 keeps the 7 that match, drops n1 as for any bad piece, and takes the bad block
    alone from the store; the fetcher never sees a byte that did not match."""
    n1, server, blocks = nodes(9)
    digests = list(blocks)
    fetcher, source = asker(server.port)
    # The job's first request takes the slow way (its prolog may be coming); after it,
    # held blocks go out from their files.
    assert source.swarm.fetch(digests[0], PREFETCH) == blocks[digests[0]]
    for d in digests[1:]:
        n1.cache.put(d, blocks[d])
    bad = digests[5]
    damaged = bytearray(blocks[bad])
    damaged[100] ^= 1
    where = n1.cache.locate(bad)
    assert where is not None
    with open(where.path, "r+b") as f:
        f.seek(where.offset)
        f.write(damaged)
    res = prefetch_hot(
        fetcher, source, n1.manifest, range(1, 9), time.monotonic() + TIMEOUT, 1.0, RUN
    )
    assert res.complete and res.fetched_blocks == 8 and res.failed == 0
    assert n1.runs() == [0, 8]
    assert holds_exactly(fetcher.cache, {d: blocks[d] for d in digests[1:]})
    assert fetcher.stats.run_blocks == 7 and fetcher.stats.corrupt == 0
    assert source.swarm.stats.corrupt == 1 and "do not match" in source.swarm.stats.dropped["n1"]
    assert source.origin.read == [bad]  # type: ignore[attr-defined]


def test_a_block_the_peer_cannot_get_is_left_out_of_its_run(  # type: ignore[no-untyped-def]
    nodes, asker, tmp_path
) -> None:
    """n1's store lacks one block of the run: n1 answers with the other 7 and a 0 for it,
    is not dropped (it is alive, its source failed), and n2 takes that block alone from
    its own store."""
    n1, server, blocks = nodes(8)
    lacking = open_store(f"file://{tmp_path}/store-n1")
    missing = n1.manifest.blocks[3]
    for d, data in blocks.items():
        if d != missing:
            lacking.write_bytes(block_key(d), data)
    n1.source = StoreSource(lacking)
    n1.fetcher = Fetcher(n1.cache, workers=8, timeout=1.0)  # gives up on it in a second
    fetcher, source = asker(server.port)
    try:
        res = prefetch_hot(
            fetcher, source, n1.manifest, range(8), time.monotonic() + TIMEOUT, 1.0, RUN
        )
    finally:
        n1.fetcher.stop()
    assert res.complete and res.fetched_blocks == 8
    # (the store may answer before n1 has read that ask: hedged once n1 is late)
    wait_until(lambda: len(n1.requests) >= 2, "n1 asked for the block alone")
    assert n1.runs()[:2] == [8, 0] and n1.requests[1].piece == missing
    assert holds_exactly(fetcher.cache, blocks)
    assert fetcher.stats.run_blocks == 7 and source.origin.read == [missing]  # type: ignore[attr-defined]
    assert not source.swarm.stats.dropped and source.swarm.stats.corrupt == 0


def test_an_agent_that_knows_no_runs_serves_block_by_block(nodes, asker, serve) -> None:  # type: ignore[no-untyped-def]
    """An agent of the previous version ignores a request's blocks and finds no block by
    the run's digest ("missing"): n2 drops nothing, asks it no more runs, and takes every
    block from it alone; nothing from the store."""
    n1, _, blocks = nodes(16)
    old = serve({42: ServedJob(LOOPBACK, provider(blocks))})
    fetcher, source = asker(old.port)
    order = list(range(16))
    res = prefetch_hot(fetcher, source, n1.manifest, order, time.monotonic() + TIMEOUT, 1.0, RUN)
    assert res.complete and res.fetched_blocks == 16
    assert holds_exactly(fetcher.cache, blocks)
    assert source.counts() == (0, 16 * BS) and source.origin.read == []  # type: ignore[attr-defined]
    assert not source.swarm.stats.dropped and fetcher.stats.run_blocks == 0
    assert source.swarm.stats.runs == 2  # both queued before the first answer came
    assert source.run_peer(n1.manifest.blocks[0]) is None  # no more runs asked of it


def test_a_readers_miss_is_fetched_alone_ahead_of_a_queued_run(nodes, asker) -> None:  # type: ignore[no-untyped-def]
    """With one fetch thread busy on a run, a reader's miss on a block of the next run
    queued is asked alone as soon as the thread is free; that run goes without it."""
    n1, server, blocks = nodes(16)
    fetcher, source = asker(server.port, workers=1)
    n1.hold.clear()  # n1 answers no run until the miss is queued
    prefetch = threading.Thread(
        target=prefetch_hot,
        args=(fetcher, source, n1.manifest, range(16), time.monotonic() + TIMEOUT, 1.0, RUN),
    )
    prefetch.start()
    try:
        wait_until(lambda: n1.runs() == [8], "the first run asked")
        missed = n1.manifest.blocks[12]
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.append(fetcher.get(source, n1.manifest, 12)))
        reader.start()
        wait_until(lambda: _queued_at(fetcher, missed, DEMAND), "the reader's miss queued")
    finally:
        n1.hold.set()
    reader.join(TIMEOUT)
    prefetch.join(TIMEOUT)
    assert got == [blocks[missed]]
    assert n1.runs() == [8, 0, 7] and n1.requests[1].piece == missed
    assert holds_exactly(fetcher.cache, blocks)


def _queued_at(fetcher: Fetcher, digest: str, priority: int) -> bool:
    with fetcher._cond:
        job = fetcher._jobs.get(digest)
        return job is not None and job.priority == priority


def test_runs_are_checked_on_the_wire() -> None:
    d = "ab" * 32
    ok = PieceRequest(42, "cd" * 32, run_digest([d, d]), PREFETCH, blocks=(3, 4))
    doc = json.loads(ok.encode()[4:])
    assert PieceRequest.decode(doc) == ok
    for bad in ([-1], ["3"], [1.5], list(range(MAX_RUN + 1)), "3"):
        with pytest.raises(PeerError, match="malformed"):
            PieceRequest.decode({**doc, "blocks": bad})
    with pytest.raises(PeerError, match="malformed"):  # a run is of the image, never located
        PieceRequest.decode({**doc, "key": "deps/u/k/data.tar.zst"})
    # A piece's request and reply are as the previous version sends them.
    assert b"blocks" not in PieceRequest(42, "cd" * 32, d, PREFETCH).encode()
    assert b"sizes" not in PieceReply(size=5).encode()
    reply = json.loads(PieceReply(size=5, sizes=(2, 0, 3)).encode()[4:])
    assert PieceReply.decode(reply).sizes == (2, 0, 3)
    with pytest.raises(PeerError, match="add up"):
        PieceReply.decode({**reply, "sizes": [2, 2]})


def test_a_run_is_received_into_a_buffer_used_again_and_its_bad_block_never_lands(  # type: ignore[no-untyped-def]
    nodes, asker
) -> None:
    """The receive path without copies (issue 19 item 3): a run's bytes land in a
    page-aligned buffer of the client's, its blocks are checked there and written to the
    cache from there; the buffer is taken again for later runs once the blocks are let
    go. A byte flipped in the middle of a run is caught there: not one byte of the bad
    block reaches the cache's packs, the good blocks around it do, and the bad one comes
    from the store."""
    n1, server, blocks = nodes(33)
    digests = list(blocks)
    fetcher, source = asker(server.port)
    assert source.swarm.fetch(digests[0], PREFETCH) == blocks[digests[0]]  # the first: slow way
    for d in digests[1:]:
        n1.cache.put(d, blocks[d])
    bad = digests[12]  # the middle of the second run of 8
    damaged = bytearray(blocks[bad])
    damaged[BS // 2] ^= 0x40
    where = n1.cache.locate(bad)
    assert where is not None
    with open(where.path, "r+b") as f:
        f.seek(where.offset)
        f.write(damaged)
    client = source.swarm.client
    res = prefetch_hot(
        fetcher, source, n1.manifest, range(1, 33), time.monotonic() + TIMEOUT, 1.0, RUN
    )
    assert res.complete and res.fetched_blocks == 32 and res.failed == 0
    assert n1.runs()[:2] == [0, 8]  # the rest: block by block, n1 dropped for the bad one
    assert holds_exactly(fetcher.cache, {d: blocks[d] for d in digests[1:]})
    assert source.swarm.stats.corrupt == 1 and source.origin.read == [bad]  # type: ignore[attr-defined]
    packs = b"".join(p.read_bytes() for p in (fetcher.cache.root / "packs").glob("*.pack"))
    assert bytes(damaged) not in packs and blocks[bad] in packs
    assert client.buffers.made >= 1
    # Runs after runs: the buffers are taken again, not made anew for each.
    n1b, server_b, blocks_b = nodes(8 * 12)
    fetcher_b, source_b = asker(server_b.port, workers=2)
    res = prefetch_hot(
        fetcher_b, source_b, n1b.manifest, range(8 * 12), time.monotonic() + TIMEOUT, 1.0, RUN
    )
    assert res.complete and n1b.runs() == [8] * 12
    assert holds_exactly(fetcher_b.cache, blocks_b)
    buffers = source_b.swarm.client.buffers
    assert buffers.made <= 4  # of 12 runs
    # Once the fetcher is idle, no buffer is held (not by its idle threads either).
    wait_until(lambda: buffers.held() == 0, timeout=TIMEOUT, what="the run buffers let go")


class GatedStore(CountingStore):
    """The counting store, its reads held until ``gate`` is set."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.gate = threading.Event()
        self.entered = threading.Event()  # a read is under way (and held)

    def read_block(self, index: int, digest: str, offset: int, length: int, prio: int) -> bytes:
        self.entered.set()
        assert self.gate.wait(TIMEOUT)
        return super().read_block(index, digest, offset, length, prio)


def test_a_peers_run_of_blocks_not_queued_here_goes_before_this_nodes_own_hot_set(
    tmp_path: Path,
) -> None:
    """n1 prefetches its own hot set (one fetch thread, the store held); n2's run asks
    for blocks n1 has not queued: n1 reads them from the store next, not after its whole
    hot set (a mid-size N = 2 start waited ~10 s for such a run, its prolog with it)."""
    store = open_store(f"file://{tmp_path}/store")
    manifest, blocks = image_of_n1(store, 24)
    source = GatedStore(store)
    fetcher = Fetcher(BlockCache(tmp_path / "n1", 1 << 30), workers=1, timeout=TIMEOUT)
    own = list(range(20))  # n1's hot set; blocks 20-23 are only n2's
    try:
        prefetch = threading.Thread(
            target=prefetch_hot,
            args=(fetcher, source, manifest, own, time.monotonic() + TIMEOUT, 1.0, RUN),
        )
        prefetch.start()
        wait_until(lambda: _queued_at(fetcher, manifest.blocks[19], PREFETCH), "hot set queued")
        assert source.entered.wait(TIMEOUT)  # the one thread holds block 0's read
        wanted = (20, 21, 0, 5)  # two n1 has not queued, two it has
        req = PieceRequest(
            42, "", run_digest([manifest.blocks[i] for i in wanted]), PREFETCH, blocks=wanted
        )
        answer: list[RunBlocks] = []
        peer = threading.Thread(
            target=lambda: answer.append(
                provide_run(fetcher, source, manifest, req, time.monotonic() + TIMEOUT, RUN)
            )
        )
        peer.start()
        wait_until(lambda: _queued_at(fetcher, manifest.blocks[21], PREFETCH), "run queued")
        source.gate.set()
        peer.join(TIMEOUT)
        prefetch.join(TIMEOUT)
    finally:
        source.gate.set()
        fetcher.stop()
    assert [bytes(b) if b is not None else None for b in answer[0]] == [
        blocks[manifest.blocks[i]] for i in wanted
    ]
    # Store reads in order: the one under way when the run came (block 0), then the
    # run's two n1 had not queued, then the rest of n1's own.
    order = [manifest.blocks.index(d) for d in source.read]
    assert order[:3] == [0, 20, 21], order
    assert sorted(order) == list(range(22))  # each block read once
