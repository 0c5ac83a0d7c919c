"""A user's report checks a job's rows against what Slurm says of the job.

A user's ``bootseer report`` has no site key, so it cannot check the seals of the
phase files (:mod:`bootseer.phases.seal`; root's report does): a file carrying a seal
may still be one she could not tell from a forgery. What she can check is the job
itself, while slurmctld remembers it (``MinJobAge`` after it ends, or in accounting):
its latest run's rows must be of the nodes Slurm lists for the job, and of its user.
Rows of any other node or user are not counted, and the report says so; what could
not be checked (earlier runs of a requeued job, a job Slurm forgot) is said too
(:func:`bootseer.phases.report.check_against_slurm` applies it to a report)::

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
