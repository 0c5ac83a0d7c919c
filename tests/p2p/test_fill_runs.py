"""The image's background fill in runs (issue 19): the cold rest's blocks a node gets
from one peer asked in one request per run (image order among that peer's), each block
checked by its own digest, a bad one dropping the peer and coming from elsewhere, an
agent that knows no runs served block by block, and a job's read never held behind a
fill's run in flight.

The two nodes of tests/p2p/test_runs.py: n1 serves the job's image as the agent does,
n2 fills through :class:`PeerSource`, its own fetcher and cache.
"""

from __future__ import annotations

import hashlib
import os
import threading

from bootseer.image.blocks import block_key
from bootseer.image.manifest import Manifest
from bootseer.image.prefetch import BackgroundFill
from bootseer.p2p.owner import owner
from bootseer.p2p.server import HeldPiece, ServedJob
from bootseer.p2p.wire import PieceRequest
from bootseer.store import open_store
from tests.p2p.test_peers import LOOPBACK, TIMEOUT, provider
from tests.p2p.test_runs import BS, RUN, asker, holds_exactly, nodes, serve
from tests.waiting import wait_until

__all__ = ["asker", "nodes", "serve"]  # the fixtures, shared with test_runs


def fill_of(fetcher, source, manifest, skip: set[int], run_bytes: int) -> BackgroundFill:  # type: ignore[no-untyped-def]
    fill = BackgroundFill(manifest.id)
    fill.start(fetcher, source, manifest, skip, run_bytes)
    return fill


def ended(fill: BackgroundFill) -> BackgroundFill:
    wait_until(lambda: fill.ended is not None, "the fill's end", timeout=TIMEOUT)
    return fill


def test_the_fill_asks_a_peer_in_runs(nodes, asker) -> None:  # type: ignore[no-untyped-def]
    """The hot set (blocks 0-3) local already: the fill's other 20 blocks, all n1's, go
    as runs of 8, 8 and 4 (three requests at n1, not 20), nothing from the store."""
    n1, server, blocks = nodes(24)
    fetcher, source = asker(server.port)
    digests = list(blocks)
    for d in digests[:4]:
        fetcher.cache.put(d, blocks[d])
    fill = ended(fill_of(fetcher, source, n1.manifest, set(), RUN))
    assert fill.total == fill.done == 20 and fill.failed == 0 and fill.state == "done"
    assert sorted(n1.runs()) == [4, 8, 8]  # two fill threads: either run may land first
    assert holds_exactly(fetcher.cache, blocks)
    assert fetcher.stats.runs == 3 and fetcher.stats.run_blocks == 20
    assert source.counts() == (0, 20 * BS) and source.origin.read == []  # type: ignore[attr-defined]
    assert not source.swarm.stats.dropped
    # Without runs (prefetch_run_kib = 0) the fill asks one request per block.
    n1b, server_b, blocks_b = nodes(5)
    fetcher_b, source_b = asker(server_b.port)
    ended(fill_of(fetcher_b, source_b, n1b.manifest, set(), 0))
    assert n1b.runs() == [0] * 5 and holds_exactly(fetcher_b.cache, blocks_b)


def test_a_bad_block_in_a_fill_run_drops_the_peer_and_comes_from_the_store(  # type: ignore[no-untyped-def]
    nodes, asker, serve, tmp_path
) -> None:
    """n1 holds the fill's two runs and sends one block of the first damaged (from a file
    of its own, as a damaged cache would: sendfile does not look): n2 keeps the 7 good
    ones, drops n1, and takes the bad one alone from the store; the second run, queued
    before the drop, is not asked of n1: its blocks go alone, to the store (n1's
    parent), and the fill ends with no failure."""
    n1, _, blocks = nodes(17)
    digests = list(blocks)
    bad = digests[5]
    damaged = bytearray(blocks[bad])
    damaged[100] ^= 1
    (tmp_path / "damaged").write_bytes(damaged)

    def held(req: PieceRequest) -> HeldPiece | list[HeldPiece] | None:
        got: HeldPiece | list[HeldPiece] | None = n1.held(req)
        if isinstance(got, list) and 5 in req.blocks:
            got[req.blocks.index(5)] = HeldPiece(tmp_path / "damaged", BS)
        return got

    server = serve({42: ServedJob(LOOPBACK, n1.provide, held)})
    fetcher, source = asker(server.port)
    fetcher.background_workers = 1  # one run after the other
    # The job's first request takes the slow way; after it held blocks go by sendfile.
    assert source.swarm.fetch(digests[0], 1) == blocks[digests[0]]
    fetcher.cache.put(digests[0], blocks[digests[0]])
    for d in digests[1:]:
        n1.cache.put(d, blocks[d])
    fill = ended(fill_of(fetcher, source, n1.manifest, set(), RUN))
    assert fill.done == 16 and fill.failed == 0
    assert n1.runs() == [0, 8]
    assert holds_exactly(fetcher.cache, blocks)
    assert fetcher.stats.run_blocks == 7 and fetcher.stats.corrupt == 0
    assert source.swarm.stats.corrupt == 1 and "do not match" in source.swarm.stats.dropped["n1"]
    assert sorted(source.origin.read) == sorted([bad, *digests[9:]])  # type: ignore[attr-defined]


def test_a_fill_from_an_agent_that_knows_no_runs_goes_block_by_block(  # type: ignore[no-untyped-def]
    nodes, asker, serve
) -> None:
    n1, _, blocks = nodes(16)
    old = serve({42: ServedJob(LOOPBACK, provider(blocks))})
    fetcher, source = asker(old.port)
    fill = ended(fill_of(fetcher, source, n1.manifest, set(), RUN))
    assert fill.done == 16 and fill.failed == 0 and holds_exactly(fetcher.cache, blocks)
    assert source.origin.read == [] and not source.swarm.stats.dropped  # type: ignore[attr-defined]
    assert fetcher.stats.run_blocks == 0 and source.run_peer(n1.manifest.blocks[0]) is None


def test_a_read_is_not_held_behind_a_fill_run_in_flight(nodes, asker) -> None:  # type: ignore[no-untyped-def]
    """n1 answers no run (its own start keeps it busy) until the test lets it: a job's
    read of a block inside a fill's run in flight is asked alone beside it and answered
    while the run is still held; the run then brings the rest, and the fill ends whole."""
    n1, server, blocks = nodes(16)
    fetcher, source = asker(server.port)
    n1.hold.clear()
    fill = fill_of(fetcher, source, n1.manifest, set(), RUN)
    got: list[tuple[bool, int]] = []  # the block read right, and the runs answered by then

    def read() -> None:
        data = fetcher.get(source, n1.manifest, 3)
        got.append((data == blocks[n1.manifest.blocks[3]], fetcher.stats.runs))

    try:
        wait_until(lambda: n1.runs() == [8, 8], "both fill runs asked", timeout=TIMEOUT)
        reader = threading.Thread(target=read)
        reader.start()
        wait_until(lambda: got, "the read answered", timeout=TIMEOUT)
        assert got == [(True, 0)]  # no run had come back: it did not wait for one
        assert n1.runs() == [8, 8, 0] and n1.requests[2].piece == n1.manifest.blocks[3]
    finally:
        n1.hold.set()
    reader.join(TIMEOUT)
    ended(fill)
    assert fill.done == 16 and fill.failed == 0 and holds_exactly(fetcher.cache, blocks)


def test_the_fill_takes_its_own_share_first_then_the_peers_in_runs(  # type: ignore[no-untyped-def]
    nodes, asker, tmp_path
) -> None:
    """n2's fill reads the blocks it owns from the store before it asks n1 for a run of
    n1's (each node's fill does the same): by then n1 has had its own share's time, and
    holds the run. One fill thread, n1 answering no run yet: when n1 is asked, n2's own
    blocks are all read already."""
    n1, server, blocks = nodes(8)
    store = open_store(f"file://{tmp_path}/store")
    mine: dict[str, bytes] = {}
    while len(mine) < 4:
        data = os.urandom(BS)
        d = hashlib.sha256(data).hexdigest()
        if owner(d, ("n1", "n2")) == "n2":
            mine[d] = data
            store.write_bytes(block_key(d), data)
    theirs = list(blocks)
    mixed = [d for pair in zip(theirs[::2], theirs[1::2], mine, strict=True) for d in pair]
    n1.manifest = Manifest(len(mixed) * BS, BS, tuple(mixed))  # n1's, n1's, n2's, ...
    fetcher, source = asker(server.port)
    fetcher.background_workers = 1
    n1.hold.clear()
    try:
        fill = fill_of(fetcher, source, n1.manifest, set(), RUN)
        wait_until(lambda: n1.runs() == [8], "the run of n1's blocks asked", timeout=TIMEOUT)
        assert sorted(source.origin.read) == sorted(mine)  # type: ignore[attr-defined]
    finally:
        n1.hold.set()
    ended(fill)
    assert fill.done == 12 and fill.failed == 0 and fetcher.stats.run_blocks == 8
    assert holds_exactly(fetcher.cache, {**blocks, **mine})
