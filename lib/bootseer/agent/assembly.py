"""The node agent: prepares images for jobs, serves them lazily, records and prefetches.

One agent runs per node (``bootseer agent``; packaging/bootseer-agent.service;
:func:`bootseer.agent.daemon.serve` runs it). :class:`Agent` builds and holds its
parts, each a module of its own:

- :mod:`~bootseer.image.cache` and :mod:`~bootseer.image.fetch`: the node's verified
  blocks, and the one place they are fetched from a block source (the store, an image
  file; a new source, such as a peer node, is one more ``BlockSource``);
- :mod:`~bootseer.agent.jobs`: the job lifecycle (prepare, first step, release), with
  :mod:`~bootseer.agent.restart` keeping each prepared job across an agent restart;
- :mod:`~bootseer.image.reader`: an image's bytes for the FUSE mount
  (:mod:`~bootseer.agent.fuse`);
- :mod:`~bootseer.agent.handler`, :mod:`~bootseer.agent.server`: the unix socket the
  prolog, epilog and jobs ask (:mod:`~bootseer.agentapi` is its contract,
  :mod:`~bootseer.agentapi.client` its one client).

    >>> agent = Agent(load_config().for_node("n1"), "n1")  # doctest: +SKIP
    >>> agent.stats().cache_bytes  # doctest: +SKIP
    0
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from typing import Protocol

from bootseer.agent.agentlog import MAX_BYTES, AgentLog
from bootseer.agent.jobs import Jobs
from bootseer.agent.jobscope import JobScopes
from bootseer.agent.sweep import Sweeper
from bootseer.agentapi.errors import AgentBadRequest, AgentError
from bootseer.agentapi.jobs import FetchPiece, PieceFile, RestartReply, StatsReply
from bootseer.agentapi.views import ImageListReply, ImageName
from bootseer.config import SiteConfig
from bootseer.context import expand_nodes
from bootseer.errors import BootseerError, ContextError
from bootseer.image.blocks import check_block_size
from bootseer.image.cache import BlockCache
from bootseer.image.fetch import Fetcher
from bootseer.image.reader import ImageReader
from bootseer.linelog import LineLog
from bootseer.nodepaths import NodePaths
from bootseer.p2p.node import PeerNode
from bootseer.p2p.pieces import Located, Pieces
from bootseer.p2p.server import HeldPiece, RunBlocks
from bootseer.p2p.wire import PeerError, PieceRequest
from bootseer.sitekey import site_keys
from bootseer.store import Store

# Names an image listing reads and returns at most (each a sealed record read as root).
MAX_LISTED = 10_000


class Restarter(Protocol):
    """What restarts the agent in place when asked (:class:`bootseer.agent.handover.Handover`,
    which the daemon sets): the handover knows the agent, not the other way round."""

    def request(self, when_idle: bool, own: int = 1) -> RestartReply: ...


@functools.lru_cache(maxsize=64)
def _job_nodes(nodelist: str) -> tuple[str, ...]:
    """A located piece's node list, expanded once per job, not per request (a unit or a
    frame each: 12 ms of ClusterShell for 10,000 nodes)."""
    return expand_nodes(nodelist)


class Agent:
    """One node's block cache, fetcher and prepared jobs."""

    def __init__(
        self,
        cfg: SiteConfig,
        node: str,
        log: Callable[[str], None] | None = None,
        store: Store | None = None,
    ) -> None:
        self.cfg = cfg
        self.node = node
        self.started = time.time()
        self.handover: Restarter | None = None  # set by the daemon: restarts in place
        # The socket's open connections by uid (set by the daemon, which runs the server).
        self.open_connections: Callable[[], dict[int, int]] = dict
        icfg = cfg.image
        self.paths = NodePaths(cfg)
        # Bounded: anyone can make the agent log (a refused peer, a user's long name).
        self.log = log or AgentLog(LineLog(self.paths.agent_log(node), "agent", MAX_BYTES))
        # Opened without a request: a store slow or down when the agent starts (a loaded
        # node, its link busy: pyarrow's 5 s connect bound was passed at load 130-250)
        # must not stop it; each read says what is wrong, and peers may serve meanwhile.
        # The site makes the store's root (``bootseer config --init``), never the agent.
        self.store = store or cfg.store.open(create=False, look=False)
        self.cache = BlockCache(
            self.paths.image_cache, int(icfg.cache_size_gib * (1 << 30)), self.log
        )
        self.fetcher = Fetcher(
            self.cache,
            icfg.prefetch_parallel,
            icfg.background_parallel,
            icfg.fetch_timeout,
            self.log,
            background_bps=icfg.fill_mbit * 1e6 / 8,
        )
        block_size = check_block_size(icfg.block_size_kib << 10)
        self.jobs = Jobs(
            icfg,
            self.paths,
            self.store,
            self.cache,
            self.fetcher,
            block_size,
            self.log,
            keys=lambda: site_keys(cfg),
        )
        if not (keys := site_keys(cfg)).keys:
            self.log(f"no site key: every image record will be refused ({keys.missing})")
        self.pieces = Pieces(self.store, self.cache, self._ckpt_target)
        self._targets: dict[str, Store] = {}
        # Whose each job is (Slurm): a peer gets only located pieces of that job's scopes.
        self.scopes = JobScopes(cfg.phases.squeue, cfg.phases.squeue_timeout, self.log)
        self.peers = PeerNode.start(cfg.p2p, node, self.provide, self.log, self.held)
        self.jobs.peers = self.peers
        self.reader = ImageReader(self.cache, self.fetcher)
        self.sweeper = Sweeper(
            node,
            self.paths.run_dir,
            cfg.phases.squeue,
            cfg.hooks.sweep_interval,
            prepared=self.jobs.ids,
            release=lambda job: f"image released (trace {self.jobs.release(job).trace})",
            log=self.log,
        )

    def provide(self, req: PieceRequest, deadline: float) -> bytes | memoryview | RunBlocks:
        """A piece for another node of one of this node's jobs (the peer server asks)."""
        if not req.key:
            return self.jobs.provide_block(req, deadline)
        self.scopes.check(req.job_id, req.target, req.key)  # one of the job's pieces
        swarm = self.peers.join_existing(req.job_id) if self.peers else None
        loc = Located(req.target, req.key, req.offset, req.length, req.piece)
        if req.cached_only:
            data = self.cache.read(req.piece, 0, req.length)
            if data is None:
                raise PeerError("missing", f"{req.key} at {req.offset} is not held here")
            return data
        timeout = max(0.0, deadline - time.monotonic())
        data, _ = self.pieces.get(swarm, loc, req.priority, timeout, local=False)
        return data

    def held(self, req: PieceRequest) -> HeldPiece | list[HeldPiece] | None:
        """The file of a piece of the job's this node holds, for the peer server to send
        as it is (``provide`` answers what this returns None for, errors included)."""
        if not req.key:
            return self.jobs.held_block(req)
        try:
            Located(req.target, req.key, req.offset, req.length, req.piece).check()
            self.scopes.check(req.job_id, req.target, req.key)
        except PeerError:
            return None
        where = self.cache.locate(req.piece)
        if where is None or where.size != req.length:
            return None
        return HeldPiece(where.path, where.size, where.offset)

    def fetch_piece(self, req: FetchPiece) -> tuple[PieceFile, int | None]:
        """A located piece for this node's prolog or checkpoint daemon, from the cache,
        the job's peers or the store: where the cache keeps it (its pack and the offset
        in it) and, when the request asks for it, the pack opened (the caller closes it;
        None where the disk did not take the piece)."""
        swarm = None
        if req.uid >= 0:  # root's word (FetchPiece is root's alone): no squeue for the job
            self.scopes.learn(req.job_id, req.uid, req.account)
        if self.peers is not None and req.nodelist:
            try:
                swarm = self.peers.join(req.job_id, _job_nodes(req.nodelist))
            except ContextError as exc:
                raise AgentBadRequest(str(exc)) from None
        loc = Located(req.target, req.key, req.offset, req.length, req.digest)
        try:
            held = self.pieces.held(loc, local=True) if req.pass_file else None
            if held is None:
                _, source = self.pieces.get(
                    swarm, loc, req.priority, self.cfg.image.fetch_timeout, local=True
                )
                opened = self.cache.open_held(req.digest) if req.pass_file else None
                held = (*opened, source) if opened is not None else None
        except PeerError as exc:
            raise AgentError(str(exc)) from None
        if held is None:
            # The caller reads it by the pack's name (and checks its digest); "": the
            # disk did not take it, the caller reads the store.
            where = self.cache.locate(req.digest)
            if where is None or where.size != req.length:
                return PieceFile("", source, req.length, offset=0), None
            return PieceFile(str(where.path), source, req.length, offset=where.offset), None
        # The caller reads the block and checks it against the CRCs: this process reads
        # nothing (a cache hit) or only writes (a piece just fetched and verified).
        fd, where, crcs, source = held
        reply = PieceFile(
            str(where.path), source, req.length, passed=True, crcs=tuple(crcs), offset=where.offset
        )
        return reply, fd

    def _ckpt_target(self, uri: str) -> Store | None:
        """The site's checkpoint target ``uri``, opened once; None if it is not one."""
        targets = self.cfg.ckpt.targets
        if uri not in targets and self.cfg.source is not None:
            # An admin may add targets without restarting the agents: read them afresh.
            from bootseer.config import load_config

            with contextlib.suppress(BootseerError):
                targets = load_config(self.cfg.source).ckpt.targets
        if uri not in targets:
            return None
        if uri not in self._targets:
            self._targets[uri] = self.cfg.store.open_uri(uri)
        return self._targets[uri]

    def image_names(self) -> ImageListReply:
        """The image names whose records verify, at most :data:`MAX_LISTED` of them."""
        from bootseer.image.registry import list_names

        names = list_names(self.store, keys=site_keys(self.cfg), limit=MAX_LISTED + 1)
        images = [
            ImageName(ref, record.image, record.size, record.added)
            for ref, record in names[:MAX_LISTED]
        ]
        return ImageListReply(images, left_out=max(0, len(names) - MAX_LISTED))

    def stats(self, uid: int | None = None) -> StatsReply:
        """The node's counters; its jobs, or with ``uid`` only that user's."""
        s = self.fetcher.stats
        jobs = (
            self.jobs.ids()
            if uid is None
            else [v.job_id for v in self.jobs.views() if v.uid == uid]
        )
        return StatsReply(
            node=self.node,
            jobs=jobs,
            cache_bytes=self.cache.bytes,
            cache_blocks=len(self.cache),
            cache_cap=self.cache.cap,
            evicted=self.cache.evicted,
            fetched_blocks=s.blocks,
            fetched_bytes=s.bytes,
            demand_bytes=s.by_priority[0],
            prefetch_bytes=s.by_priority[1],
            background_bytes=s.by_priority[2],
            corrupt_refused=s.corrupt,
            fetch_errors=s.errors,
            read_requests=self.reader.requests,
            read_bytes=self.reader.bytes,
            connections=(
                sum(self.open_connections().values())
                if uid is None
                else self.open_connections().get(uid, 0)
            ),
        )

    def close(self) -> None:
        if isinstance(self.log, AgentLog):
            self.log.flush(float("inf"))
        self.sweeper.close()
        self.fetcher.stop()
        self.jobs.close()
        if self.peers is not None:
            self.peers.close()
