"""What ``bootseer report`` computes: one job's startup, or the cluster's over a period.

Definitions (docs/report.md says the same to users):

- *allocation* and *startup*: as :mod:`bootseer.phases.startup` defines them for the
  cluster view too (allocation to the end of the last ``first_step``, or without one to
  the end of the last startup phase).
- a node is *ready* when its first step starts (``first_step``'s start, which a
  collective first step makes the moment that node could train); a node without a
  ``first_step`` mark is ready when its last startup phase ends.
- the *straggler*: the node ready last, if it was ready at least 0.5 s and 10% after
  the median node; it held the job back by that lag, and the phase it spent most above
  that phase's median is named.
- *queue wait*: submit time to allocation.

    >>> from bootseer.store import open_store
    >>> from bootseer.phases.schema import JobMeta
    >>> from bootseer.phases.writer import write_rows
    >>> store = open_store("file:///tmp/doc-phases")
    >>> _ = write_rows(store, [JobMeta(job_id=7, node="n1").row("prolog", 1e9, 1e9 + 2)], "prolog")
    >>> from bootseer.phases.reader import PhaseDataset
    >>> report = job_report(PhaseDataset(store), 7)
    >>> report.runs[0].nodes[0].node
    'n1'
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bootseer.phases import startup
from bootseer.phases.schema import (
    PHASE_ORDER,
    STARTUP_END,
    TEARDOWN_PHASES,
    PhaseRow,
    from_table,
)

if TYPE_CHECKING:
    from pathlib import Path

    import pyarrow as pa

    from bootseer.phases.reader import PhaseDataset
    from bootseer.phases.seal import Tally
    from bootseer.phases.slurmcheck import SlurmCheck

SIZE_BUCKETS = ((1, 1), (2, 4), (5, 16), (17, 64), (65, 256), (257, 1024), (1025, 1 << 31))


def bucket_label(lo: int, hi: int) -> str:
    if lo == hi:
        return f"{lo} node" + ("s" if lo > 1 else "")
    if hi >= 1 << 31:
        return f"{lo}+ nodes"
    return f"{lo}-{hi} nodes"


@dataclass
class PhaseStat:
    phase: str
    nodes: int
    min: float
    median: float
    max: float
    slowest: str  # the node with the max
    outcomes: dict[str, int]
    bytes: int
    store_bytes: int = 0  # summed over nodes
    peer_bytes: int = 0


@dataclass
class NodeTimeline:
    node: str
    ready: float  # seconds after allocation
    done: float  # seconds after allocation: end of its first_step, or ready
    rows: list[PhaseRow]

    @property
    def store_bytes(self) -> int:
        return sum(r.store_bytes for r in self.rows)

    @property
    def peer_bytes(self) -> int:
        return sum(r.peer_bytes for r in self.rows)


@dataclass
class Straggler:
    node: str
    behind: float  # seconds after the median node was ready
    phase: str | None  # the phase it spent most above that phase's median
    phase_seconds: float = 0.0
    phase_median: float = 0.0


@dataclass
class RunReport:
    job_id: int
    restart_count: int
    job_name: str
    user: str
    account: str
    node_count: int
    gpus_per_node: int
    submit_time: float | None
    array_job_id: int | None
    array_task_id: int | None
    script: str  # the batch script's path, "" where Slurm did not say
    allocated: float
    startup: float  # seconds, allocation to the end of startup
    startup_end: str  # "first_step", or the phase that ended last
    nodes: list[NodeTimeline]
    phases: list[PhaseStat]
    straggler: Straggler | None
    missing_nodes: int  # node_count minus the nodes with rows

    @property
    def label(self) -> str:
        return f"{self.job_id}" + (f" run {self.restart_count}" if self.restart_count else "")

    @property
    def array_task(self) -> str | None:
        """``6_1`` for task 1 of array job 6."""
        if self.array_job_id is None or self.array_task_id is None:
            return None
        return f"{self.array_job_id}_{self.array_task_id}"

    def failures(self) -> list[tuple[str, str, str, list[str]]]:
        """(phase, outcome, reason, nodes) of each failed or timed-out phase, one entry
        per distinct reason, in phase order."""
        seen: dict[tuple[str, str, str], list[str]] = {}
        for n in self.nodes:
            for r in n.rows:
                if r.outcome in ("failed", "timed_out"):
                    seen.setdefault((r.phase, r.outcome, r.detail), []).append(n.node)
        order = {p.phase: i for i, p in enumerate(self.phases)}
        return [
            (phase, outcome, detail, nodes)
            for (phase, outcome, detail), nodes in sorted(
                seen.items(), key=lambda kv: (order.get(kv[0][0], 0), kv[0][2])
            )
        ]

    @property
    def queue_wait(self) -> float | None:
        return None if self.submit_time is None else max(0.0, self.allocated - self.submit_time)

    def phase(self, name: str) -> PhaseStat | None:
        return next((p for p in self.phases if p.phase == name), None)

    @property
    def store_egress_bytes(self) -> int:
        """What the run's nodes fetched from the shared store, every phase, all nodes."""
        return sum(n.store_bytes for n in self.nodes)

    @property
    def peer_bytes(self) -> int:
        """What the run's nodes got from each other."""
        return sum(n.peer_bytes for n in self.nodes)

    def to_json(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "restart_count": self.restart_count,
            "job_name": self.job_name,
            "user": self.user,
            "account": self.account,
            "node_count": self.node_count,
            "gpus_per_node": self.gpus_per_node,
            "submit_time": _iso(self.submit_time),
            "array_task": self.array_task,
            "script": self.script,
            "allocated": _iso(self.allocated),
            "queue_wait_seconds": _r(self.queue_wait),
            "startup_seconds": _r(self.startup),
            "startup_end": self.startup_end,
            "missing_nodes": self.missing_nodes,
            "store_egress_bytes": self.store_egress_bytes,
            "peer_bytes": self.peer_bytes,
            "straggler": None
            if self.straggler is None
            else {
                "node": self.straggler.node,
                "behind_seconds": _r(self.straggler.behind),
                "phase": self.straggler.phase,
                "phase_seconds": _r(self.straggler.phase_seconds),
                "phase_median_seconds": _r(self.straggler.phase_median),
            },
            "phases": [
                {
                    "phase": p.phase,
                    "nodes": p.nodes,
                    "min_seconds": _r(p.min),
                    "median_seconds": _r(p.median),
                    "max_seconds": _r(p.max),
                    "slowest_node": p.slowest,
                    "outcomes": p.outcomes,
                    "bytes": p.bytes,
                    "store_bytes": p.store_bytes,
                    "peer_bytes": p.peer_bytes,
                }
                for p in self.phases
            ],
            "nodes": [
                {
                    "node": n.node,
                    "ready_seconds": _r(n.ready),
                    "done_seconds": _r(n.done),
                    "store_bytes": n.store_bytes,
                    "peer_bytes": n.peer_bytes,
                    "phases": [
                        {
                            "phase": r.phase,
                            "start": _iso(r.start),
                            "end": _iso(r.end),
                            "start_offset_seconds": _r(r.start - self.allocated),
                            "seconds": _r(r.seconds),
                            "outcome": r.outcome,
                            "bytes": r.bytes,
                            "store_bytes": r.store_bytes,
                            "peer_bytes": r.peer_bytes,
                            "detail": r.detail,
                        }
                        for r in n.rows
                    ],
                }
                for n in self.nodes
            ],
        }


@dataclass
class JobReport:
    job_id: int
    runs: list[RunReport]  # this job's runs (restarts), oldest first
    earlier: list[RunReport] = field(default_factory=list)  # same user, same batch script
    # Marks outside their job's window (phases.window): dropped, or clipped to it.
    marks_dropped: int = 0
    marks_clipped: int = 0
    # The files' seals (phases.seal), where the reader checked them; what Slurm said of
    # the job (phases.slurmcheck), where a report without the key asked.
    seals: Tally | None = None
    slurm: SlurmCheck | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "found": bool(self.runs),
            "runs": [r.to_json() for r in self.runs],
            "earlier_jobs": [r.to_json() for r in self.earlier],
            "marks_dropped": self.marks_dropped,
            "marks_clipped": self.marks_clipped,
            "seals": None if self.seals is None else self.seals.to_json(),
            "slurm_check": None if self.slurm is None else self.slurm.to_json(),
        }


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def phase_sort_key(name: str, first_start: float) -> tuple[int, float, str]:
    try:
        return (PHASE_ORDER.index(name), 0.0, name)
    except ValueError:
        return (len(PHASE_ORDER), first_start, name)


def run_report(rows: list[PhaseRow]) -> RunReport:
    """Analyse the rows of one run (one job id, one restart count)."""
    first = rows[0]
    allocated = startup.allocation(rows)
    by_node: dict[str, list[PhaseRow]] = {}
    for r in rows:
        by_node.setdefault(r.node, []).append(r)
    timelines = []
    for node, nrows in sorted(by_node.items()):
        nrows.sort(key=lambda r: (r.start, phase_sort_key(r.phase, r.start)))
        end = startup.startup_end(nrows)
        if end is None:
            ready = done = allocated
        elif end.phase == STARTUP_END:  # the node could train from its first step's start
            ready, done = end.start, end.end
        else:
            ready = done = end.end
        timelines.append(NodeTimeline(node, ready - allocated, done - allocated, nrows))

    stats = phase_stats(rows)
    end_row = startup.startup_end(rows) or first
    total = startup.startup_seconds(allocated, end_row.end)
    return RunReport(
        job_id=first.job_id,
        restart_count=first.restart_count,
        job_name=max(r.job_name for r in rows),
        user=max(r.user for r in rows),
        account=max(r.account for r in rows),
        node_count=max(r.node_count for r in rows),
        gpus_per_node=max(r.gpus_per_node for r in rows),
        submit_time=max((r.submit_time for r in rows if r.submit_time is not None), default=None),
        array_job_id=max(
            (r.array_job_id for r in rows if r.array_job_id is not None), default=None
        ),
        array_task_id=max(
            (r.array_task_id for r in rows if r.array_task_id is not None), default=None
        ),
        script=max(r.script for r in rows),
        allocated=allocated,
        startup=total,
        startup_end=end_row.phase,
        nodes=timelines,
        phases=stats,
        straggler=find_straggler(timelines, stats),
        missing_nodes=max(0, max(r.node_count for r in rows) - len(timelines)),
    )


def phase_stats(rows: list[PhaseRow]) -> list[PhaseStat]:
    by_phase: dict[str, list[PhaseRow]] = {}
    for r in rows:
        by_phase.setdefault(r.phase, []).append(r)
    out = []
    for phase, prows in by_phase.items():
        secs = [r.seconds for r in prows]
        slowest = max(prows, key=lambda r: r.seconds)
        outcomes: dict[str, int] = {}
        for r in prows:
            outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
        out.append(
            PhaseStat(
                phase,
                len(prows),
                min(secs),
                statistics.median(secs),
                max(secs),
                slowest.node,
                outcomes,
                sum(r.bytes for r in prows),
                sum(r.store_bytes for r in prows),
                sum(r.peer_bytes for r in prows),
            )
        )
    starts = {p: min(r.start for r in prows) for p, prows in by_phase.items()}
    return sorted(out, key=lambda s: phase_sort_key(s.phase, starts[s.phase]))


# A node counts as the straggler only if it was ready this much after the median node:
# the larger of an absolute floor and a share of the median node's own startup.
STRAGGLER_MIN_SECONDS = 0.5
STRAGGLER_MIN_SHARE = 0.1


def find_straggler(nodes: list[NodeTimeline], stats: list[PhaseStat]) -> Straggler | None:
    if len(nodes) < 2:
        return None
    last = max(nodes, key=lambda n: n.ready)
    median_ready = statistics.median(n.ready for n in nodes)
    behind = last.ready - median_ready
    if behind < max(STRAGGLER_MIN_SECONDS, STRAGGLER_MIN_SHARE * median_ready):
        return None  # the nodes were ready together: nobody held the job back
    medians = {s.phase: s.median for s in stats}
    worst: tuple[float, PhaseRow] | None = None
    for r in last.rows:
        if r.phase in TEARDOWN_PHASES or r.phase == STARTUP_END or r.phase == "prolog":
            continue
        excess = r.seconds - medians[r.phase]
        if worst is None or excess > worst[0]:
            worst = (excess, r)
    if worst is None or worst[0] <= 0:
        # The prolog as a whole (its steps had no single culprit), if it stands out.
        pro = next((r for r in last.rows if r.phase == "prolog"), None)
        if pro is not None and pro.seconds > medians.get("prolog", pro.seconds):
            worst = (pro.seconds - medians["prolog"], pro)
    if worst is None or worst[0] <= 0:
        return Straggler(last.node, behind, None)
    return Straggler(last.node, behind, worst[1].phase, worst[1].seconds, medians[worst[1].phase])


def runs_of(table: pa.Table) -> list[RunReport]:
    """One report per (job id, restart count) in ``table``, oldest first."""
    groups: dict[tuple[int, int], list[PhaseRow]] = {}
    for r in from_table(table):
        groups.setdefault((r.job_id, r.restart_count), []).append(r)
    runs = [run_report(rows) for rows in groups.values()]
    return sorted(runs, key=lambda r: r.allocated)


def job_report(
    ds: PhaseDataset, job_id: int, history_days: float = 30, history_jobs: int = 4
) -> JobReport:
    """The report of ``job_id``: its runs (restarts), and up to ``history_jobs`` earlier
    jobs of the same user from the same batch script (its path, as Slurm gave it) in the
    ``history_days`` before it. A job whose script Slurm did not name (``sbatch`` reading
    standard input) is compared with its own restarts only: a job name says too little
    (every notebook's job is ``interactive``, every test's ``test``)."""
    dropped, clipped = ds.marks_dropped, ds.marks_clipped
    runs = runs_of(ds.job(job_id))
    report = JobReport(job_id, runs)
    report.marks_dropped = ds.marks_dropped - dropped
    report.marks_clipped = ds.marks_clipped - clipped
    report.seals = None if ds.seals is None else ds.seals.copy()
    if not runs or not runs[0].script:
        return report
    import pyarrow.compute as pc

    first = runs[0]
    where = (
        (pc.field("user") == first.user)
        & (pc.field("script") == first.script)
        & (pc.field("job_id") != job_id)
    )
    # Only the first node's rows may carry the script (Slurm tells the prolog no more):
    # find the earlier jobs by it, then read each whole.
    named = (
        ds.since(first.allocated - history_days * 86400, where, columns=["start"])
        .group_by("job_id")
        .aggregate([("start", "min")])
    )
    older = sorted(
        (s, j)
        for j, s in zip(named["job_id"].to_pylist(), named["start_min"].to_pylist(), strict=True)
        if s.timestamp() < first.allocated
    )
    for _, old_id in older[-history_jobs:]:
        report.earlier += runs_of(ds.job(old_id))
    report.seals = None if ds.seals is None else ds.seals.copy()
    return report


def check_against_slurm(report: JobReport, squeue: Path, timeout: float = 10.0) -> SlurmCheck:
    """Check ``report``'s latest run against Slurm (``squeue``), dropping the rows of
    nodes or users Slurm does not list for the job; the check says what it did."""
    from bootseer.phases.slurmcheck import SlurmCheck
    from bootseer.slurmjobs import SlurmUnavailable, job_nodes

    if not report.runs:
        return SlurmCheck(unchecked="no records to check")
    try:
        job = job_nodes(report.job_id, squeue, timeout)
    except SlurmUnavailable as exc:
        return SlurmCheck(unchecked=f"Slurm could not be asked ({exc})")
    if job is None:
        return SlurmCheck(
            unchecked=f"Slurm no longer knows job {report.job_id}: its nodes and user "
            "could not be checked"
        )
    latest = max(report.runs, key=lambda r: r.restart_count)
    check = SlurmCheck.of(job, latest.restart_count)
    if check.run is None:
        return check
    rows = [r for n in latest.nodes for r in n.rows]
    kept = [r for r in rows if check.keeps(r.node, r.user)]
    for r in rows:
        if not check.keeps(r.node, r.user):
            check.dropped[r.node] = check.dropped.get(r.node, 0) + 1
    if len(kept) != len(rows):
        at = report.runs.index(latest)
        if kept:
            report.runs[at] = run_report(kept)
        else:
            del report.runs[at]
    return check
