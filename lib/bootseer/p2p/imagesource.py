"""Image blocks from the job's peers: each block leaves the store once per job.

:class:`PeerSource` is the block source of a job that runs on several nodes: a block
comes from its owner among the job's nodes (:mod:`bootseer.p2p`), verified, and from
the image's own source (the store, an image file) only when this node owns the block or
its owner failed or is late; a store that fails or is late has the nodes that hold the
block asked (:mod:`bootseer.p2p.fallback`)::

    >>> swarm = peer_node.join(42, ("n1", "n2"))                        # doctest: +SKIP
    >>> source = PeerSource(StoreSource(store), swarm, manifest)        # doctest: +SKIP

It also serves runs (:class:`bootseer.image.fetch.RunSource`): the prefetch asks the
node above this one in a block's tree for many of its blocks in one request
(:meth:`bootseer.p2p.swarm.Swarm.fetch_run`); a block the run did not bring is then
asked for alone, the way above. A block's tree is its range's
(:func:`bootseer.p2p.owner.range_owner_index`), so the blocks a node reads from the
store itself come in stretches; where the hot set is bundled
(:mod:`bootseer.image.bundles`), those it reads are runs of a bundle too
(``bundles``), one ranged read each, as a one-node job's are.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections.abc import Sequence

from bootseer.digest import matches as digest_matches
from bootseer.image.bundles import BundleSource
from bootseer.image.cache import BlockCache
from bootseer.image.fetch import BlockSource, Fetcher, RunBlock, RunPart
from bootseer.image.manifest import Manifest
from bootseer.image.prefetch import request_blocks
from bootseer.p2p.fallback import fetch_piece
from bootseer.p2p.owner import range_owner_index
from bootseer.p2p.server import HeldPiece, RunBlocks
from bootseer.p2p.swarm import Swarm
from bootseer.p2p.wire import PeerError, PieceRequest, run_digest

# A run is answered with what is here by this part of the asker's bound: a reply after
# its own bound (it counts from its send) would be dropped, each block asked again.
ANSWER_BY = 0.8


class PeerSource:
    def __init__(
        self,
        origin: BlockSource,
        swarm: Swarm,
        manifest: Manifest | None = None,
        bundles: BundleSource | None = None,
    ) -> None:
        """``manifest``: the job's image's (its blocks' trees are by range of it; None:
        each by its digest, as a piece outside the image's); ``bundles``: the hot set's
        bundles, read for the blocks this node gets from the store itself."""
        self.origin = origin
        self.swarm = swarm
        self.manifest = manifest
        self.bundles = bundles
        # This image's blocks only (the swarm's stats also count the job's other pieces,
        # snapshot frames): from the origin, and from peers.
        self.store_bytes = 0
        self.peer_bytes = 0
        self._lock = threading.Lock()
        self._local = threading.local()  # .verified: (bytes, digest) just verified, per thread

    def matches(self, data: bytes, block_digest: str) -> bool:
        """Whether ``data`` is the block (the fetcher asks): bytes that the swarm just
        verified on receipt and returned to this thread are not hashed a second time
        (0.1 CPU-s per GiB here, SHA-256's 0.5); the origin's bytes are."""
        verified = getattr(self._local, "verified", None)
        self._local.verified = None
        if verified is not None and verified[0] is data and verified[1] == block_digest:
            return True
        return digest_matches(data, block_digest)

    def read_block(
        self, index: int, block_digest: str, offset: int, length: int, priority: int
    ) -> bytes:
        def from_store() -> bytes:
            data = self.origin.read_block(index, block_digest, offset, length, priority)
            self.swarm.count_store(len(data))  # out of the store, whoever won
            with self._lock:
                self.store_bytes += len(data)
            return data

        root = self.root(block_digest)
        data, where = fetch_piece(self.swarm, block_digest, priority, from_store, root=root)
        if where == "store":
            self._local.verified = None  # the fetcher checks the origin's bytes
        else:
            with self._lock:
                self.peer_bytes += len(data)
            self._local.verified = (data, block_digest)
        return data

    def root(self, block_digest: str) -> int | None:
        """The index among the job's nodes of the root of the block's tree: its range's
        owner (by the block's first place in the image: a block the image holds twice
        has one tree); None for a digest that is no block of the image (its owner by
        digest then)."""
        m = self.manifest
        i = m.index_of(block_digest) if m is not None else None
        if m is None or i is None:
            return None
        return range_owner_index(m.id, i, m.block_size, len(self.swarm.nodes))

    def run_peer(self, block_digest: str) -> str | None:
        """The node a run holding this block is asked of, or the bundle that holds it
        where this node gets it from the store itself; None: ask for it alone (from
        the store, or that node does not know runs)."""
        root = self.root(block_digest)
        peer = self.swarm.run_source(block_digest, root)
        if peer is not None or self.bundles is None:
            return peer
        if self.swarm.source(block_digest, root) is not None:
            return None  # that node serves no runs: asked alone
        return self.bundles.run_peer(block_digest)

    def read_run(
        self, peer: str, blocks: Sequence[RunBlock], priority: int
    ) -> list[RunPart | None]:
        if self.bundles is not None and self.bundles.holds(peer):
            bundled = self.bundles.read_run(peer, blocks, priority)
            nbytes = sum(len(b[0]) for b in bundled if b is not None)
            self.swarm.count_store(nbytes)
            with self._lock:
                self.store_bytes += nbytes
            return bundled
        got = self.swarm.fetch_run(peer, blocks, priority)
        with self._lock:
            self.peer_bytes += sum(len(b[0]) for b in got if b is not None)
        return list(got)

    def counts(self) -> tuple[int, int]:
        """(bytes from the store, bytes from peers) so far."""
        with self._lock:
            return self.store_bytes, self.peer_bytes

    def describe(self) -> str:
        return f"{self.origin.describe()} (peers of job {self.swarm.job_id})"


def is_run(manifest: Manifest, req: PieceRequest) -> bool:
    """Whether the request's blocks are the image's and its digest names exactly them."""
    if any(i >= manifest.nblocks for i in req.blocks):
        return False
    return run_digest([manifest.blocks[i] for i in req.blocks]) == req.piece


def held_run(cache: BlockCache, manifest: Manifest, req: PieceRequest) -> list[HeldPiece] | None:
    """Where the cache holds each block when this node holds every block of the run (the
    peer server sends them as they are); None otherwise (:func:`provide_run` answers)."""
    if not is_run(manifest, req):
        return None
    held = []
    for i in req.blocks:
        where = cache.locate(manifest.blocks[i])
        if where is None or where.size != manifest.block_length(i):
            return None
        held.append(HeldPiece(where.path, where.size, where.offset))
    return held


def provide_run(
    fetcher: Fetcher,
    source: BlockSource,
    manifest: Manifest,
    req: PieceRequest,
    deadline: float,
    run_bytes: int,
    held_only: bool = False,
) -> RunBlocks:
    """A run's blocks for a peer, in its order: those held, and those fetched for it at
    its priority (in runs too, where this node is a relay: it asks the node above it) by
    a little before the asker's bound (``held_only``: none fetched); a block not got by
    then is not sent (the asker asks for it alone). PeerError("missing") if the run is
    not of this image's blocks, ("failed") if no block of it came in time."""
    if not is_run(manifest, req):
        raise PeerError("missing", "not a run of blocks of the job's image")
    out: RunBlocks = [
        fetcher.cache.read(manifest.blocks[i], 0, manifest.block_length(i)) for i in req.blocks
    ]
    wanted = [i for i, b in zip(req.blocks, out, strict=True) if b is None]
    if wanted and not held_only:
        # Ahead of this node's own hot set (the job's nodes read the same trace, but a
        # run may hold blocks this node has not queued yet, or not at all): queued
        # behind it, such a block held its whole run, and the asker's prolog, ~10 s on
        # a mid-size N = 2 start (docs/performance.md, "Two nodes against one").
        futures = request_blocks(
            fetcher, source, manifest, wanted, req.priority, run_bytes, ahead=True
        )
        cf.wait(futures, timeout=max(0.0, deadline - time.monotonic()) * ANSWER_BY)
        got = {
            i: f.result()
            for f, i in futures.items()
            if f.done() and not f.cancelled() and f.exception() is None
        }
        out = [got.get(i) if b is None else b for i, b in zip(req.blocks, out, strict=True)]
    if all(b is None for b in out):
        raise PeerError("failed", f"no block of the run of {len(out)} came in time")
    return out
