"""Image blocks from the job's peers: each block leaves the store once per job.

:class:`PeerSource` is the block source of a job that runs on several nodes: a block
comes from its owner among the job's nodes (:mod:`bootseer.p2p`), verified, and from
the image's own source (the store, an image file) only when this node owns the block or
its owner failed::

    >>> source = PeerSource(StoreSource(store), peer_node.join(42, ("n1", "n2")))  # doctest: +SKIP
"""

from __future__ import annotations

from bootseer.image.fetch import BlockSource
from bootseer.p2p.swarm import Swarm


class PeerSource:
    def __init__(self, origin: BlockSource, swarm: Swarm) -> None:
        self.origin = origin
        self.swarm = swarm

    def read_block(
        self, index: int, block_digest: str, offset: int, length: int, priority: int
    ) -> bytes:
        data = self.swarm.fetch(block_digest, priority)
        if data is None:
            data = self.origin.read_block(index, block_digest, offset, length, priority)
            self.swarm.count_store(len(data))
        return data

    def describe(self) -> str:
        return f"{self.origin.describe()} (peers of job {self.swarm.job_id})"
