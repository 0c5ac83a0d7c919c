"""The cluster view (``bootseer report --since 7d``), computed column-wise with pyarrow.

Per run (job id, restart count): allocation and startup end as
:mod:`bootseer.phases.startup` defines them for the job report too, job end (the epilog's start:
Slurm runs the epilog when the job ends). Node-seconds spent starting are startup x
nodes (every node waits for the straggler), GPU-seconds x GPUs per node as well. The
share of allocated time is over the runs that have ended (those with an epilog row).
Only runs with a ``prolog`` row count: a run seen only through later rows started
before the period. Rows are not merged here (see ``PhaseDataset.since(exact=False)``):
over a year that is most of the time a merge costs, and only the top-phases sums
could notice the rare duplicate.

    >>> from bootseer.store import open_store
    >>> from bootseer.phases.schema import JobMeta
    >>> from bootseer.phases.writer import write_rows
    >>> store = open_store("file:///tmp/doc-phases")
    >>> _ = write_rows(store, [JobMeta(job_id=7, node="n1").row("prolog", 1e9, 1e9 + 2)], "prolog")
    >>> from bootseer.phases.reader import PhaseDataset
    >>> view = cluster_report(PhaseDataset(store), since=0)
    >>> view.runs >= 1
    True
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bootseer.phases import startup
from bootseer.phases.report import SIZE_BUCKETS, bucket_label

if TYPE_CHECKING:
    import pyarrow as pa

    from bootseer.phases.reader import PhaseDataset
    from bootseer.phases.seal import Tally


@dataclass
class Bucket:
    label: str
    runs: int
    median: float
    p90: float
    max: float
    startups: list[float] = field(default_factory=list, repr=False)  # for the box plot


@dataclass
class PhaseTotal:
    phase: str
    node_seconds: float
    runs: int
    median: float  # seconds, over job-node rows


@dataclass
class ClusterReport:
    since: float
    until: float
    runs: int
    jobs: int
    startup_seconds: float  # sum over runs
    startup_median: float
    startup_p90: float
    node_seconds: float
    gpu_seconds: float
    share: float | None  # startup node-seconds / allocated node-seconds, over ended runs
    ended_runs: int
    buckets: list[Bucket]
    top_phases: list[PhaseTotal]
    rows: int
    read_seconds: float = 0.0
    compute_seconds: float = 0.0
    # Marks outside their job's window (phases.window): dropped, or clipped to it.
    marks_dropped: int = 0
    marks_clipped: int = 0
    seals: Tally | None = None  # the files' seals (phases.seal), where they were checked

    def to_json(self) -> dict[str, object]:
        return {
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.since)),
            "until": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.until)),
            "jobs": self.jobs,
            "runs": self.runs,
            "rows": self.rows,
            "startup_seconds_total": round(self.startup_seconds, 1),
            "startup_seconds_median": round(self.startup_median, 3),
            "startup_seconds_p90": round(self.startup_p90, 3),
            "node_seconds_starting": round(self.node_seconds, 1),
            "gpu_seconds_starting": round(self.gpu_seconds, 1),
            "startup_share_of_allocated_time": None if self.share is None else round(self.share, 5),
            "ended_runs": self.ended_runs,
            "marks_dropped": self.marks_dropped,
            "marks_clipped": self.marks_clipped,
            "seals": None if self.seals is None else self.seals.to_json(),
            "by_size": [
                {
                    "bucket": b.label,
                    "runs": b.runs,
                    "median_seconds": round(b.median, 3),
                    "p90_seconds": round(b.p90, 3),
                    "max_seconds": round(b.max, 3),
                }
                for b in self.buckets
            ],
            "top_phases": [
                {
                    "phase": p.phase,
                    "node_seconds": round(p.node_seconds, 1),
                    "runs": p.runs,
                    "median_seconds": round(p.median, 3),
                }
                for p in self.top_phases
            ],
        }


def _secs(col: Any) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.divide(pc.cast(col, pa.int64()), 1e6)


def run_table(table: pa.Table) -> pa.Table:
    """One row per run: job_id, restart_count, allocated, startup_end, job_end (epoch
    seconds), has_prolog, node_count, gpus_per_node."""
    import pyarrow as pa
    import pyarrow.compute as pc

    phase = table["phase"]
    start, end = _secs(table["start"]), _secs(table["end"])
    null = pa.scalar(None, pa.float64())
    t = pa.table(
        {
            "job_id": table["job_id"],
            "restart_count": table["restart_count"],
            "start": start,
            **startup.run_columns(phase, end),
            "epilog_start": pc.if_else(pc.equal(phase, "epilog"), start, null),
            "is_prolog": pc.cast(pc.equal(phase, "prolog"), pa.int8()),
            "node_count": table["node_count"],
            "gpus_per_node": table["gpus_per_node"],
        }
    )
    g = t.group_by(["job_id", "restart_count"]).aggregate(
        [
            ("start", "min"),
            ("step_end", "max"),
            ("ready_end", "max"),
            ("epilog_start", "min"),
            ("is_prolog", "max"),
            ("node_count", "max"),
            ("gpus_per_node", "max"),
        ]
    )
    return pa.table(
        {
            "job_id": g["job_id"],
            "restart_count": g["restart_count"],
            "allocated": g["start_min"],
            "startup_end": startup.end_column(g["step_end_max"], g["ready_end_max"]),
            "job_end": g["epilog_start_min"],
            "has_prolog": pc.equal(g["is_prolog_max"], 1),
            "node_count": g["node_count_max"],
            "gpus_per_node": g["gpus_per_node_max"],
        }
    )


def _quantiles(values: Any, qs: list[float]) -> list[float]:
    import pyarrow.compute as pc

    if len(values) == 0:
        return [0.0] * len(qs)
    return [float(v) for v in pc.quantile(values, q=qs).to_pylist()]


def cluster_report(
    ds: PhaseDataset, since: float, until: float | None = None, top: int = 8
) -> ClusterReport:
    import pyarrow as pa
    import pyarrow.compute as pc

    until = time.time() if until is None else until
    t0 = time.perf_counter()
    dropped, clipped = ds.marks_dropped, ds.marks_clipped
    table = ds.since(
        since,
        exact=False,
        columns=["job_id", "restart_count", "phase", "start", "end", "node_count", "gpus_per_node"],
    )
    t1 = time.perf_counter()
    runs = run_table(table)
    keep = pc.and_(
        pc.and_(runs["has_prolog"], pc.greater_equal(runs["allocated"], since)),
        pc.less(runs["allocated"], until),
    )
    runs = runs.filter(keep)
    secs = startup.seconds_column(runs["allocated"], runs["startup_end"])
    nodes = pc.cast(runs["node_count"], pa.float64())
    node_secs = pc.multiply(secs, nodes)
    gpu_secs = pc.multiply(node_secs, pc.cast(runs["gpus_per_node"], pa.float64()))
    ended = pc.is_valid(runs["job_end"])
    alloc_secs = pc.multiply(pc.subtract(runs["job_end"], runs["allocated"]), nodes)
    ended_alloc = pc.sum(pc.filter(alloc_secs, ended)).as_py() or 0.0
    ended_start = pc.sum(pc.filter(node_secs, ended)).as_py() or 0.0

    buckets = []
    for lo, hi in SIZE_BUCKETS:
        sel = pc.and_(
            pc.greater_equal(runs["node_count"], lo), pc.less_equal(runs["node_count"], hi)
        )
        vals = pc.filter(secs, sel)
        if len(vals) == 0:
            continue
        med, p90 = _quantiles(vals, [0.5, 0.9])
        buckets.append(
            Bucket(
                bucket_label(lo, hi),
                len(vals),
                med,
                p90,
                float(pc.max(vals).as_py()),
                vals.to_pylist(),
            )
        )

    # Top phases: job-node rows of the kept runs, secs phases only.
    def run_key(t: Any) -> Any:
        return pc.add(
            pc.multiply(pc.cast(t["job_id"], pa.int64()), 1000),
            pc.cast(t["restart_count"], pa.int64()),
        )

    keep_rows = pc.and_(
        pc.is_in(run_key(table), value_set=run_key(runs)),
        startup.in_startup_column(table["phase"]),
    )
    rows = table.filter(keep_rows)
    dur = pc.subtract(_secs(rows["end"]), _secs(rows["start"]))
    per = (
        pa.table({"phase": rows["phase"], "dur": dur, "run": run_key(rows)})
        .group_by("phase")
        .aggregate([("dur", "sum"), ("dur", "approximate_median"), ("run", "count_distinct")])
    )
    per = per.sort_by([("dur_sum", "descending")]).slice(0, top)
    phases = [
        PhaseTotal(p["phase"], p["dur_sum"], p["run_count_distinct"], p["dur_approximate_median"])
        for p in per.to_pylist()
    ]
    med, p90 = _quantiles(secs, [0.5, 0.9])
    t2 = time.perf_counter()
    return ClusterReport(
        since=since,
        until=until,
        runs=runs.num_rows,
        jobs=len(pc.unique(runs["job_id"])),
        startup_seconds=pc.sum(secs).as_py() or 0.0,
        startup_median=med,
        startup_p90=p90,
        node_seconds=pc.sum(node_secs).as_py() or 0.0,
        gpu_seconds=pc.sum(gpu_secs).as_py() or 0.0,
        share=(ended_start / ended_alloc) if ended_alloc > 0 else None,
        ended_runs=int(pc.sum(pc.cast(ended, pa.int64())).as_py() or 0),
        buckets=buckets,
        top_phases=phases,
        rows=table.num_rows,
        read_seconds=t1 - t0,
        compute_seconds=t2 - t1,
        marks_dropped=ds.marks_dropped - dropped,
        marks_clipped=ds.marks_clipped - clipped,
        seals=None if ds.seals is None else ds.seals.copy(),
    )
