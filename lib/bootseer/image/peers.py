"""Image blocks from the job's peers: each block leaves the store once per job.

:class:`PeerSource` is the block source of a job that runs on several nodes: a block
comes from its owner among the job's nodes (:mod:`bootseer.p2p`), verified, and from
the image's own source (the store, an image file) only when this node owns the block or
its owner failed. :class:`Peers` is the agent's side of it: the site key, the peer
server other nodes ask, and one :class:`~bootseer.p2p.swarm.Swarm` per job::

    >>> peers = Peers.start(cfg.p2p, "n2", log)  # None when p2p is off or has no key
    >>> source = PeerSource(StoreSource(store), peers.swarm(42, ("n1", "n2")))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bootseer.config import P2PSection
from bootseer.errors import ConfigError
from bootseer.image.fetch import BlockSource
from bootseer.p2p.auth import job_token, load_site_key
from bootseer.p2p.client import PeerClient
from bootseer.p2p.hosts import Resolver
from bootseer.p2p.server import PeerServer, ServedJob
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


class Peers:
    """This node's part in its jobs' swarms."""

    def __init__(
        self,
        cfg: P2PSection,
        node: str,
        site_key: bytes,
        lookup: Callable[[int], ServedJob | None],
        log: Callable[[str], None],
    ) -> None:
        self.cfg = cfg
        self.node = node
        self.site_key = site_key
        self.log = log
        self.resolver = Resolver(cfg.port, cfg.hosts_file)
        self.client = PeerClient(timeout=cfg.peer_timeout)
        self.server = PeerServer(
            ("0.0.0.0", cfg.port),
            site_key,
            lookup,
            log,
            max_connections=cfg.max_connections,
            serve_timeout=cfg.peer_timeout,
        )

    @classmethod
    def start(
        cls,
        cfg: P2PSection,
        node: str,
        lookup: Callable[[int], ServedJob | None],
        log: Callable[[str], None],
    ) -> Peers | None:
        """The node's peer service, serving; None (every node uses the store) if off."""
        if not cfg.enabled:
            return None
        try:
            key = load_site_key(cfg.key_file)
            peers = cls(cfg, node, key, lookup, log)
        except (ConfigError, OSError) as exc:
            log(f"p2p off: {exc}")
            return None
        peers.server.start()
        log(f"p2p: serving peers on port {cfg.port}")
        return peers

    def swarm(self, job_id: int, nodes: Sequence[str]) -> Swarm:
        return Swarm(
            job_id,
            self.node,
            nodes,
            job_token(self.site_key, job_id),
            self.resolver.resolve,
            self.client,
            self.log,
            dead_for=self.cfg.dead_for,
        )

    def addresses(self, nodes: Sequence[str]) -> frozenset[str]:
        return self.resolver.addresses(tuple(nodes))

    def close(self) -> None:
        self.server.close()
        self.client.close()
