"""This node's part in its jobs' swarms: the site key, the peer server, one swarm per job.

The agent owns one :class:`PeerNode`. A job joins when its prolog first needs a piece
(an image prepare, a snapshot frame); the server then answers that job's other nodes
with ``provide`` (the agent's: image blocks by digest, located pieces from the store)::

    >>> node = PeerNode.start(cfg.p2p, "n2", agent.provide, log)  # None: p2p off  # doctest: +SKIP
    >>> swarm = node.join(42, ("n1", "n2"))  # doctest: +SKIP
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bootseer.config import P2PSection
from bootseer.errors import ConfigError, describe
from bootseer.p2p.auth import job_token, load_site_key
from bootseer.p2p.client import PeerClient
from bootseer.p2p.hosts import Resolver
from bootseer.p2p.server import HeldPiece, PeerServer, RunBlocks, ServedJob
from bootseer.p2p.swarm import Swarm, SwarmStats
from bootseer.p2p.wire import PieceRequest

# A job no request touched this long has ended (its epilog may not tell the agent: a
# job without an image never releases one).
IDLE_JOB = 3600.0

Provide = Callable[[PieceRequest, float], bytes | memoryview | RunBlocks]
# The piece's file (a run's: its blocks'), if held (ServedJob)
Held = Callable[[PieceRequest], HeldPiece | list[HeldPiece] | None]


@dataclass
class _Member:
    swarm: Swarm
    addresses: frozenset[str]
    used: float


class PeerNode:
    def __init__(
        self,
        cfg: P2PSection,
        node: str,
        site_key: bytes,
        provide: Provide,
        log: Callable[[str], None],
        held: Held | None = None,
    ) -> None:
        self.cfg = cfg
        self.node = node
        self.site_key = site_key
        self.provide = provide
        self.held = held
        self.log = log
        self.resolver = Resolver(cfg.port, cfg.hosts_file)
        self.client = PeerClient(
            timeout=cfg.peer_timeout, silence=cfg.peer_silence, max_open=cfg.max_connections
        )
        self._jobs: dict[int, _Member] = {}
        self._lock = threading.Lock()
        self._retired = SwarmStats()  # the counts of swarms that have ended (metrics)
        self.server = PeerServer(
            ("0.0.0.0", cfg.port),
            site_key,
            self.served,
            log,
            max_connections=cfg.max_connections,
            serve_timeout=cfg.peer_timeout,
            # A late prolog is waited for, leaving the owner a third of the asker's
            # bound to get the piece once it is there.
            job_wait=cfg.peer_timeout * 2 / 3,
        )

    @classmethod
    def start(
        cls,
        cfg: P2PSection,
        node: str,
        provide: Provide,
        log: Callable[[str], None],
        held: Held | None = None,
    ) -> PeerNode | None:
        """The node's peer service, serving; None (every node uses the store) if off."""
        if not cfg.enabled:
            return None
        try:
            peers = cls(cfg, node, load_site_key(cfg.key_file), provide, log, held)
        except (ConfigError, OSError) as exc:
            log(f"p2p off: {describe(exc)}")
            return None
        peers.server.start()
        log(f"p2p: serving peers on port {cfg.port}")
        if cfg.port >= 1024:
            log(
                f"p2p: warning: port {cfg.port} is not privileged: while this agent is down "
                "a user could listen on it and relay requests of the job's other nodes"
            )
        return peers

    def join(self, job_id: int, nodes: Sequence[str]) -> Swarm | None:
        """The job's swarm (made on first use); None when the job has no peers here."""
        now = time.monotonic()
        with self._lock:
            member = self._jobs.get(job_id)
            if member is None:
                # Once per job, not per piece: 10,000 names to look through.
                if len(nodes) < 2 or self.node not in nodes:
                    return None
                swarm = Swarm(
                    job_id,
                    self.node,
                    nodes,
                    job_token(self.site_key, job_id),
                    self.resolver.resolve,
                    self.client,
                    self.log,
                    dead_for=self.cfg.dead_for,
                )
                member = self._jobs[job_id] = _Member(swarm, frozenset(), now)
                for old in [j for j, m in self._jobs.items() if now - m.used > IDLE_JOB]:
                    self._retire(self._jobs.pop(old))
            member.used = now
        self.server.jobs_changed()
        return member.swarm

    def join_existing(self, job_id: int) -> Swarm | None:
        with self._lock:
            member = self._jobs.get(job_id)
        return member.swarm if member else None

    def leave(self, job_id: int) -> None:
        with self._lock:
            member = self._jobs.pop(job_id, None)
            if member is not None:
                self._retire(member)

    def _retire(self, member: _Member) -> None:
        """Keep an ending swarm's counts in the node's totals (caller holds the lock)."""
        for name in ("peer_bytes", "store_bytes", "peer_failures", "corrupt"):
            setattr(
                self._retired,
                name,
                getattr(self._retired, name) + getattr(member.swarm.stats, name),
            )

    def totals(self) -> SwarmStats:
        """The node's counts over all its swarms since the agent started (``dropped``
        left empty): bytes from peers and the store, peers dropped, corrupt pieces."""
        with self._lock:
            swarms = [self._retired, *(m.swarm.stats for m in self._jobs.values())]
            return SwarmStats(
                peer_bytes=sum(s.peer_bytes for s in swarms),
                store_bytes=sum(s.store_bytes for s in swarms),
                peer_failures=sum(s.peer_failures for s in swarms),
                corrupt=sum(s.corrupt for s in swarms),
            )

    def served(self, job_id: int) -> ServedJob | None:
        with self._lock:
            member = self._jobs.get(job_id)
            if member is None:
                return None
            member.used = time.monotonic()
        if not member.addresses:
            # Resolved on the first request, not in the prolog: the prolog's path stays
            # free of name lookups (one per node of the job).
            member.addresses = self.resolver.addresses(member.swarm.nodes)
        return ServedJob(member.addresses, self.provide, self.held, member.swarm.rates.median)

    def close(self) -> None:
        self.server.close()
        self.client.close()
