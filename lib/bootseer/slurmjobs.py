"""What Slurm runs on this node: the jobs it lists here, and in which state.

The node agent's sweep (:mod:`bootseer.agent.sweep`) and ``bootseer doctor`` ask it
before they call a job's state on the node stale. They ask Slurm, never the clock (jobs
run for weeks), with one ``squeue`` for the node::

    squeue --noheader --states=all --nodelist=NODE --format='%A %T'

Not ``--json``: Slurm 22.05 ignores every filter with ``--json`` and prints the whole
queue (the report's parser bounds it at 256 MB); the text form gives this node's jobs
only, and just the two fields wanted (never the job's name, a user's free text). ``%A``
is the job id as the hooks see it (``SLURM_JOB_ID``, an array task's own id too).

Slurm lists a job that ended for ``MinJobAge`` (300 s by default), in a state such as
``COMPLETED``; a job it lists in any other state (``CONFIGURING`` during its prolog,
``RUNNING``, ``COMPLETING`` during its epilogs, ``SUSPENDED``, a state it adds later)
runs here. A job it does not list here has ended, or runs elsewhere (requeued).

    >>> parse_jobs("4711 RUNNING\\n4712 COMPLETED\\n")
    {4711: 'RUNNING', 4712: 'COMPLETED'}
    >>> sorted(NodeJobs({4711: "RUNNING", 4712: "COMPLETED"}).running)
    [4711]
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bootseer.errors import BootseerError

# States after which a job runs nowhere (squeue's long names). Any other state, one
# Slurm adds later included, counts as running: the sweep keeps what it does not know.
ENDED = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "TIMEOUT",
    }
)
MAX_OUTPUT = 4 << 20  # a node runs hundreds of jobs at most; lines of ~20 bytes
TIMEOUT = 10.0  # seconds squeue gets (slurmctld busy); past it, Slurm "cannot be asked"


class SlurmUnavailable(BootseerError):
    """Slurm could not be asked (squeue missing, failed, timed out, said nothing usable)."""


@dataclass(frozen=True)
class NodeJobs:
    """The jobs Slurm lists on one node, by id, with their states."""

    states: dict[int, str]

    @property
    def running(self) -> frozenset[int]:
        """The jobs that run here: listed, in a state before they ended."""
        return frozenset(j for j, s in self.states.items() if s not in ENDED)

    def runs(self, job_id: int) -> bool:
        return job_id in self.running


def parse_jobs(text: str) -> dict[int, str]:
    """``%A %T`` lines into {job id: state}; a line of another shape is Slurm's error."""
    jobs: dict[int, str] = {}
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2 or not fields[0].isdigit() or not fields[1].replace("_", "").isalpha():
            raise SlurmUnavailable(f"squeue printed a line that is not 'JOBID STATE': {line!r}")
        jobs[int(fields[0])] = fields[1].upper()
    return jobs


def node_jobs(
    node: str, squeue: Path = Path("/usr/bin/squeue"), timeout: float = TIMEOUT
) -> NodeJobs:
    """The jobs Slurm lists on ``node``; :class:`SlurmUnavailable` when it cannot say."""
    return NodeJobs(parse_jobs(_squeue(f"--nodelist={node}", "%A %T", squeue, timeout)))


def node_users(
    node: str, squeue: Path = Path("/usr/bin/squeue"), timeout: float = TIMEOUT
) -> frozenset[int]:
    """The uids of the users with a job running on ``node`` (``%U %T`` lines: the job's
    uid and state); :class:`SlurmUnavailable` when Slurm cannot say."""
    return running_users(_squeue(f"--nodelist={node}", "%U %T", squeue, timeout))


def running_users(text: str) -> frozenset[int]:
    """``%U %T`` lines into the uids with a job in a state before it ended.

    >>> sorted(running_users("1001 COMPLETED\\n1001 RUNNING\\n1002 FAILED\\n"))
    [1001]
    """
    uids: set[int] = set()
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2 or not fields[0].isdigit() or not fields[1].replace("_", "").isalpha():
            raise SlurmUnavailable(f"squeue printed a line that is not 'UID STATE': {line!r}")
        if fields[1].upper() not in ENDED:
            uids.add(int(fields[0]))
    return frozenset(uids)


@dataclass(frozen=True)
class JobOwner:
    """Whose a job is: its user's uid and the account it runs under."""

    uid: int
    account: str


def job_owner(
    job_id: int, squeue: Path = Path("/usr/bin/squeue"), timeout: float = TIMEOUT
) -> JobOwner | None:
    """The user and account of ``job_id`` as Slurm lists it (any state), None if Slurm
    lists no such job; :class:`SlurmUnavailable` when it cannot say.

    >>> parse_owner("1001 physics\\n")
    JobOwner(uid=1001, account='physics')
    """
    return parse_owner(_squeue(f"--jobs={job_id}", "%U %a", squeue, timeout))


def parse_owner(text: str) -> JobOwner | None:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return None
    fields = lines[0].split()
    if len(fields) != 2 or not fields[0].isdigit():
        raise SlurmUnavailable(f"squeue printed a line that is not 'UID ACCOUNT': {lines[0]!r}")
    return JobOwner(int(fields[0]), fields[1])


@dataclass(frozen=True)
class JobNodes:
    """Whose a job is (user name), its state and the nodes Slurm lists for it (its
    current allocation; none while it pends)."""

    user: str
    state: str
    nodelist: str


def job_nodes(
    job_id: int, squeue: Path = Path("/usr/bin/squeue"), timeout: float = TIMEOUT
) -> JobNodes | None:
    """The user, state and nodes of ``job_id`` as Slurm lists it (any state, for as long
    as slurmctld remembers it), None if it lists no such job; :class:`SlurmUnavailable`
    when it cannot say. The fields hold no free text (never the job's name).

    >>> parse_job_nodes("alice COMPLETED n[1-2]\\n")
    JobNodes(user='alice', state='COMPLETED', nodelist='n[1-2]')
    """
    try:
        text = _squeue(f"--jobs={int(job_id)}", "%u %T %N", squeue, timeout)
    except SlurmUnavailable as exc:
        if "invalid job id" in str(exc).lower():  # a job slurmctld forgot, or never had
            return None
        raise
    return parse_job_nodes(text)


def parse_job_nodes(text: str) -> JobNodes | None:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return None
    fields = lines[0].split()
    if len(fields) not in (2, 3) or not fields[1].replace("_", "").isalpha():
        raise SlurmUnavailable(
            f"squeue printed a line that is not 'USER STATE NODES': {lines[0]!r}"
        )
    return JobNodes(fields[0], fields[1].upper(), fields[2] if len(fields) == 3 else "")


def _squeue(select: str, fmt: str, squeue: Path, timeout: float) -> str:
    cmd = [str(squeue), "--noheader", "--states=all", select, f"--format={fmt}"]
    try:
        r = subprocess.run(
            cmd,
            capture_output=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
            # An admin's SQUEUE_FORMAT, SQUEUE_STATES... would change what it prints.
            env={k: v for k, v in os.environ.items() if not k.startswith("SQUEUE_")},
        )
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"squeue gave no answer within {timeout:g}s") from None
    except OSError as exc:
        raise SlurmUnavailable(f"cannot run {squeue}: {exc.strerror or exc}") from None
    if r.returncode != 0:
        said = r.stderr.decode(errors="replace").strip().splitlines()
        raise SlurmUnavailable(
            f"squeue failed (exit {r.returncode}): {said[-1][:200] if said else 'no message'}"
        )
    if len(r.stdout) > MAX_OUTPUT:
        raise SlurmUnavailable(f"squeue printed more than {MAX_OUTPUT} bytes for {select}")
    return r.stdout.decode(errors="replace")
