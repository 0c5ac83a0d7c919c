"""A user's report checks a job's rows against what Slurm says of the job.

A user's ``bootseer report`` has no site key, so it cannot check the seals of the
phase files (:mod:`bootseer.phases.seal`; root's report does): a file carrying a seal
may still be one she could not tell from a forgery. What she can check is the job
itself, while slurmctld remembers it (``MinJobAge`` after it ends, or in accounting):
its latest run's rows must be of the nodes Slurm lists for the job, and of its user.
Rows of any other node or user are not counted, and the report says so; what could
not be checked (earlier runs of a requeued job, a job Slurm forgot) is said too::

    >>> from bootseer.slurmjobs import JobNodes
    >>> check = SlurmCheck.of(JobNodes("alice", "RUNNING", "n[1-2]"), restart=0)
    >>> check.keeps("n2", "alice"), check.keeps("n9", "alice"), check.keeps("n1", "mallory")
    (True, False, False)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bootseer.context import expand_nodes
from bootseer.errors import ContextError

if TYPE_CHECKING:
    from pathlib import Path

    from bootseer.phases.report import JobReport
    from bootseer.slurmjobs import JobNodes


@dataclass
class SlurmCheck:
    """What checking a job's rows against Slurm found. ``unchecked`` says why nothing (or
    not everything) could be checked."""

    run: int | None = None  # the restart count checked (the job's latest run)
    user: str = ""
    nodes: tuple[str, ...] = ()
    dropped: dict[str, int] = field(default_factory=dict)  # node -> rows not counted
    unchecked: str = ""

    @classmethod
    def of(cls, job: JobNodes, restart: int) -> SlurmCheck:
        try:
            nodes = expand_nodes(job.nodelist)
        except ContextError as exc:
            return cls(unchecked=f"Slurm's node list could not be read ({exc})")
        if not nodes:
            return cls(unchecked=f"Slurm lists no nodes for the job ({job.state})")
        return cls(run=restart, user=job.user, nodes=nodes)

    def keeps(self, node: str, user: str) -> bool:
        return node in self.nodes and user in ("", self.user)

    def to_json(self) -> dict[str, object]:
        return {
            "run_checked": self.run,
            "user": self.user or None,
            "nodes": list(self.nodes),
            "rows_dropped_by_node": dict(sorted(self.dropped.items())),
            "unchecked": self.unchecked or None,
        }


def check_job(report: JobReport, squeue: Path, timeout: float = 10.0) -> SlurmCheck:
    """Check ``report``'s latest run against Slurm (``squeue``), dropping the rows of
    nodes or users Slurm does not list for the job; the check says what it did."""
    from bootseer.phases.report import run_report
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
