"""Image blocks from the job's peers: each block leaves the store once per job.

:class:`PeerSource` is the block source of a job that runs on several nodes: a block
comes from its owner among the job's nodes (:mod:`bootseer.p2p`), verified, and from
the image's own source (the store, an image file) only when this node owns the block or
its owner failed or is late; a store that fails or is late has the nodes that hold the
block asked (:mod:`bootseer.p2p.fallback`)::

    >>> source = PeerSource(StoreSource(store), peer_node.join(42, ("n1", "n2")))  # doctest: +SKIP
"""

from __future__ import annotations

import threading

from bootseer.image.blocks import digest
from bootseer.image.fetch import BlockSource
from bootseer.p2p.fallback import fetch_piece
from bootseer.p2p.swarm import Swarm


class PeerSource:
    def __init__(self, origin: BlockSource, swarm: Swarm) -> None:
        self.origin = origin
        self.swarm = swarm
        # This image's blocks only (the swarm's stats also count the job's other pieces,
        # snapshot frames): from the origin, and from peers.
        self.store_bytes = 0
        self.peer_bytes = 0
        self._lock = threading.Lock()
        self._local = threading.local()  # .verified: (bytes, digest) just verified, per thread

    def matches(self, data: bytes, block_digest: str) -> bool:
        """Whether ``data`` is the block (the fetcher asks): bytes that the swarm just
        verified on receipt and returned to this thread are not hashed a second time
        (0.6 CPU-s per GiB here); the origin's bytes are."""
        verified = getattr(self._local, "verified", None)
        self._local.verified = None
        if verified is not None and verified[0] is data and verified[1] == block_digest:
            return True
        return digest(data) == block_digest

    def read_block(
        self, index: int, block_digest: str, offset: int, length: int, priority: int
    ) -> bytes:
        def from_store() -> bytes:
            data = self.origin.read_block(index, block_digest, offset, length, priority)
            self.swarm.count_store(len(data))  # out of the store, whoever won
            with self._lock:
                self.store_bytes += len(data)
            return data

        data, where = fetch_piece(self.swarm, block_digest, priority, from_store)
        if where == "store":
            self._local.verified = None  # the fetcher checks the origin's bytes
        else:
            with self._lock:
                self.peer_bytes += len(data)
            self._local.verified = (data, block_digest)
        return data

    def counts(self) -> tuple[int, int]:
        """(bytes from the store, bytes from peers) so far."""
        with self._lock:
            return self.store_bytes, self.peer_bytes

    def describe(self) -> str:
        return f"{self.origin.describe()} (peers of job {self.swarm.job_id})"
