"""The node agent's metrics: ``bootseer_agent.prom``, every ``[metrics] interval`` seconds
and once more at the agent's exit (with ``bootseer_agent_up 0``).

An agent killed outright leaves its last file behind, ``up`` still 1: alert on its age
too (``bootseer_agent_metrics_timestamp_seconds``, or node_exporter's own
``node_textfile_mtime_seconds``)::

    >>> writer = AgentMetrics.start(cfg, agent)  # None: no textfile_dir  # doctest: +SKIP
    >>> writer.stop()  # doctest: +SKIP
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from bootseer.errors import describe
from bootseer.image.fetch import BACKGROUND, DEMAND, PREFETCH
from bootseer.metrics.textfile import write_textfile

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from bootseer.agent.assembly import Agent
    from bootseer.agent.server import AgentServer
    from bootseer.config import SiteConfig

FILE = "bootseer_agent.prom"
PRIORITIES = {DEMAND: "demand", PREFETCH: "prefetch", BACKGROUND: "background"}


class AgentCollector:
    """The agent's counters as Prometheus families, read when the file is written."""

    def __init__(self, agent: Agent, started: float, server: AgentServer | None = None) -> None:
        self.agent = agent
        self.started = started
        self.server = server
        self.up = True

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        a = self.agent

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, value=value)

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, value=value)

        yield gauge("bootseer_agent_up", "1 while the node agent runs; 0 once it stopped", self.up)
        yield gauge(
            "bootseer_agent_start_time_seconds", "When the agent started (Unix time)", self.started
        )
        yield gauge(
            "bootseer_agent_metrics_timestamp_seconds",
            "When the agent wrote this file (Unix time): an old one means a dead agent",
            time.time(),
        )
        yield gauge(
            "bootseer_agent_jobs", "Jobs the agent has prepared an image for", len(a.jobs.ids())
        )
        if self.server is not None:
            yield gauge(
                "bootseer_agent_socket_connections",
                "Connections open on the agent's socket (hooks, jobs, CLI), idle kept ones too",
                sum(self.server.open_connections().values()),
            )
            yield counter(
                "bootseer_agent_socket_refused",
                "Users' connections answered busy: one user held image.max_connections_per_user "
                "open, or all users image.max_connections",
                self.server.refused,
            )
        yield counter(
            "bootseer_agent_swept_jobs",
            "Jobs whose state an epilog left behind, cleaned by the agent's sweep once Slurm "
            "no longer ran them on the node",
            a.sweeper.swept,
        )
        yield counter(
            "bootseer_agent_sweep_slurm_errors",
            "Sweeps that could not ask Slurm (squeue failed or timed out): nothing swept",
            a.sweeper.unanswered,
        )
        yield gauge("bootseer_cache_bytes", "Bytes in the node's block cache", a.cache.bytes)
        yield gauge("bootseer_cache_capacity_bytes", "The block cache's size cap", a.cache.cap)
        yield gauge("bootseer_cache_blocks", "Blocks in the node's block cache", len(a.cache))
        yield counter(
            "bootseer_cache_evicted_blocks",
            "Blocks evicted to keep the cache under its cap",
            a.cache.evicted,
        )
        reads = CounterMetricFamily(
            "bootseer_image_block_reads",
            "Image blocks jobs read through the agent's mount: hit (in the cache) or miss "
            "(waited for a fetch)",
            labels=("result",),
        )
        reads.add_metric(["hit"], a.reader.hits)
        reads.add_metric(["miss"], a.reader.misses)
        yield reads
        yield counter(
            "bootseer_image_read_requests",
            "Reads of jobs' image files that reached the agent (FUSE requests); pages the "
            "kernel holds are served without it",
            a.reader.requests,
        )
        yield counter(
            "bootseer_image_read_bytes",
            "Bytes of jobs' image files the agent served (FUSE requests)",
            a.reader.bytes,
        )
        s = a.fetcher.stats
        fetched = CounterMetricFamily(
            "bootseer_image_fetched_bytes",
            "Image block bytes the agent fetched (from the store or the job's peers), by "
            "priority: demand (a job waited), prefetch (the hot set), background (the fill)",
            labels=("priority",),
        )
        for prio, name in PRIORITIES.items():
            fetched.add_metric([name], s.by_priority[prio])
        yield fetched
        yield counter(
            "bootseer_image_fetch_errors",
            "Block fetches that failed for good (the job's read got EIO, or a prefetch gave up)",
            s.errors,
        )
        peers = a.peers.totals() if a.peers is not None else None
        bad = CounterMetricFamily(
            "bootseer_verification_failures",
            "Pieces refused because their digest did not match, by where they came from: "
            "store (or image file), peer, cache (damaged on the node's disk)",
            labels=("source",),
        )
        bad.add_metric(["store"], s.corrupt)
        bad.add_metric(["peer"], peers.corrupt if peers else 0)
        bad.add_metric(["cache"], a.cache.dropped_bad)
        yield bad
        yield refused_family(
            "bootseer_agent_records_refused",
            "Store records (image names, manifests, path records, traces, ...) the agent "
            "refused because their MAC does not verify under the site key, by purpose",
        )
        moved = CounterMetricFamily(
            "bootseer_p2p_bytes",
            "Bytes of multi-node jobs' pieces (image blocks, snapshot frames, checkpoint "
            "units) this node got, by source: peer (verified) or store",
            labels=("source",),
        )
        moved.add_metric(["peer"], peers.peer_bytes if peers else 0)
        moved.add_metric(["store"], peers.store_bytes if peers else 0)
        yield moved
        yield counter(
            "bootseer_peer_drops",
            "Peers this node stopped asking for a while (unreachable, failed, slow, or "
            "served bad bytes): it went to the store instead",
            peers.peer_failures if peers else 0,
        )
        server = a.peers.server if a.peers is not None else None
        yield counter(
            "bootseer_peer_served_bytes",
            "Bytes this node served to its jobs' other nodes",
            server.served_bytes if server else 0,
        )
        yield counter(
            "bootseer_peer_requests",
            "Requests this node's jobs' other nodes sent it (a piece, or a run of image "
            "blocks: one each)",
            server.requests if server else 0,
        )
        yield counter(
            "bootseer_peer_refused_requests",
            "Peer requests refused (bad token or not a node of the job)",
            server.refused if server else 0,
        )


def refused_family(name: str, doc: str, **labels: str) -> Metric:
    """This process' refused sealed records (:data:`bootseer.sitekey.refused`), one
    sample per purpose, zeros included."""
    from prometheus_client.core import CounterMetricFamily

    from bootseer import sitekey

    fam = CounterMetricFamily(name, doc, labels=(*labels, "purpose"))
    for purpose in sitekey.PURPOSES:
        fam.add_metric([*labels.values(), purpose], sitekey.refused[purpose])
    return fam


class AgentMetrics:
    """Writes the agent's file every ``interval`` seconds, in a thread of its own."""

    def __init__(self, cfg: SiteConfig, agent: Agent, server: AgentServer | None = None) -> None:
        assert cfg.metrics.textfile_dir is not None
        self.path = cfg.metrics.textfile_dir / FILE
        self.interval = cfg.metrics.interval
        self.log = agent.log
        self.collector = AgentCollector(agent, time.time(), server)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agent-metrics", daemon=True)
        self._failing = False

    @classmethod
    def start(
        cls, cfg: SiteConfig, agent: Agent, server: AgentServer | None = None
    ) -> AgentMetrics | None:
        if cfg.metrics.textfile_dir is None:
            return None
        writer = cls(cfg, agent, server)
        writer.write()
        writer._thread.start()
        agent.log(f"metrics: {writer.path} every {writer.interval:g}s")
        return writer

    def write(self) -> None:
        try:
            self.path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            write_textfile(self.path, self.collector)
        except Exception as exc:  # metrics never stop the agent; say so once per outage
            if not self._failing:
                self.log(f"metrics not written to {self.path}: {describe(exc)}")
            self._failing = True
        else:
            self._failing = False

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.write()

    def stop(self, last: bool = True) -> None:
        """Stop the thread; with ``last``, write the file a last time, saying the agent
        is down."""
        self._stop.set()
        self._thread.join(timeout=5)
        if last:
            self.collector.up = False
            self.write()
