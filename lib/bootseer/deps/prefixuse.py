"""Which running jobs on this node use a prefix, so that no restore swaps it under them.

A restore that replaces a prefix (another snapshot than the one in place) renames the
tree aside and the new one into place. A job of the same user still running with that
prefix keeps its open files, but every import it does from then on resolves into the new
tree: it would run on a mix of two dependency sets. So the prolog refuses such a restore
while another job uses the prefix (:mod:`bootseer.deps.step`); the same snapshot in place
is shared as before.

Who uses a prefix is what the node already keeps: every job that asked for
``--bootseer-deps`` has its prolog's state in its job dir
(``<run_dir>/jobs/<id>/deps/prolog.json``, :mod:`bootseer.deps.jobstate`) until its
epilog ends, with the prefix and (since this module) the job's uid. A job dir outlives
its job only when the epilog did not run to its end (killed, slurmd restarted); then
Slurm is asked (:mod:`bootseer.slurmjobs`, one ``squeue`` for the node, the agent's
sweep does the same): a job Slurm does not run here uses nothing. When Slurm cannot
say, the job counts as running: the restore is refused, and the job starts the
ordinary way, which is what a refusal costs; a prefix swapped under a job costs more.

Only on the replacing path, which is rare: a restore into a new or empty prefix, or of
the snapshot in place, looks at nothing here.

``bootseer deps run`` sets a restored tree aside when its own command gives another key
(:mod:`bootseer.deps.run`): the same swap, inside the job, with the job user's rights. It
cannot list the node's job dirs (root's, 0711), so it asks Slurm first which jobs run on
the node and reads the user's own copy of each one's state (:func:`mine_running`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bootseer import nodepaths
from bootseer.deps import jobstate
from bootseer.slurmjobs import SlurmUnavailable, node_jobs


@dataclass(frozen=True)
class InUse:
    """A job on this node that uses the prefix (None: Slurm could not say which jobs run
    there); ``why``: how that is known."""

    job_id: int | None
    why: str

    def describe(self) -> str:
        return f"job {self.job_id} ({self.why})" if self.job_id is not None else self.why


def named_by(run_dir: Path, prefix: str, uid: int, job_id: int) -> list[int]:
    """The other jobs on this node whose prolog state names ``prefix`` for ``uid`` (a
    state without a uid, written before it was kept, counts too). Another user's job
    naming the path was refused it (:func:`bootseer.deps.prefix.unsafe_reason`)."""
    jobs = run_dir / nodepaths.JOBS
    found: list[int] = []
    try:
        names = [n for n in (e.name for e in jobs.iterdir()) if n.isdigit()]
    except OSError:
        return []
    want = prefix.rstrip("/")
    for name in names:
        other = int(name)
        if other == job_id:
            continue
        state = jobstate.PrologState.read(nodepaths.deps_state(run_dir, other))
        if state is None or state.prefix.rstrip("/") != want:
            continue
        if state.uid is None or state.uid == uid:
            found.append(other)
    return sorted(found)


def running_users(
    run_dir: Path,
    prefix: str,
    uid: int,
    job_id: int,
    *,
    node: str,
    squeue: Path,
    timeout: float,
) -> list[InUse]:
    """The other jobs of ``uid`` that run on ``node`` with ``prefix``: named by a job dir
    (:func:`named_by`) and not ended by Slurm's account; none when no job dir names it
    (then Slurm is not asked)."""
    named = named_by(run_dir, prefix, uid, job_id)
    if not named:
        return []
    try:
        slurm = node_jobs(node, squeue, timeout)
    except SlurmUnavailable as exc:
        return [InUse(j, f"Slurm could not say whether it still runs: {exc}") for j in named]
    return [InUse(j, f"Slurm: {slurm.states[j]}") for j in named if slurm.runs(j)]


def mine_running(
    run_dir: Path, prefix: str, job_id: int, *, node: str, squeue: Path, timeout: float
) -> list[InUse]:
    """For ``bootseer deps run``, with the job user's rights: the other jobs Slurm runs on
    ``node`` whose state, in the user's own copy (``deps/job/prolog.json``: another user's
    is not readable to her, and is skipped), names ``prefix``. When Slurm cannot say, one
    :class:`InUse` without a job: the caller keeps the tree."""
    try:
        slurm = node_jobs(node, squeue, timeout)
    except SlurmUnavailable as exc:
        return [InUse(None, f"Slurm could not say which jobs run on {node}: {exc}")]
    want = prefix.rstrip("/")
    found = []
    for other in sorted(slurm.running - {job_id}):
        state = jobstate.PrologState.read(nodepaths.deps_job_state(run_dir, other))
        if state is not None and state.prefix.rstrip("/") == want:
            found.append(InUse(other, f"Slurm: {slurm.states[other]}"))
    return found
