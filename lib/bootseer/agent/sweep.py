"""What hooks left of jobs Slurm no longer runs on the node, cleaned as their epilog would.

An epilog that Slurm killed (``PrologEpilogTimeout``) or that never ran (slurmd
restarted, the node rebooted mid-job) leaves the job's state on the node: its job dir
(``<run_dir>/jobs/<job>``, with the deps step's state and the checkpoint mount's
record), its checkpoint mount, its phase spool, and in the agent its prepared image,
which holds its FUSE file and its blocks pinned in the cache. A job dir also keeps the
agent from restarting in place (:mod:`bootseer.agent.handover`) for good.

The sweep asks Slurm, never the clock (jobs run for weeks): a job whose state is on the
node is stale only when Slurm, asked after that state was listed, does not run it here
(:mod:`bootseer.slurmjobs`: not listed on this node, or listed as ended). Asked first
and listed second, a job whose prolog began in between would look stale. When Slurm
cannot be asked, nothing is stale. A stale job is cleaned as its epilog would have
cleaned it, without what the epilog records (trace aside, nothing is saved: no snapshot
capture, no phase rows): the agent releases its image, the checkpoint mount is stopped,
the spool and the job dir are removed; one log line per job. A job dir that changed
since it was listed (a prolog of the same job id, requeued onto this node) is kept.

The node agent sweeps (:class:`Sweeper`) at most once per ``[hooks] sweep_interval``
and only while some job's state is on the node, on its own and while a restart waits;
``bootseer doctor`` reports what it would sweep (:func:`find_stale`)::

    >>> Leftovers({4712: ("job dir",), 4711: ("job dir", "prepared image")}).ids
    [4711, 4712]
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bootseer import nodepaths
from bootseer.slurmjobs import NodeJobs, SlurmUnavailable, node_jobs


@dataclass(frozen=True)
class Leftovers:
    """What the node holds of each job: ``{job: ("job dir", "prepared image", ...)}``,
    and each job dir's identity when listed (inode, ctime), to see it unchanged."""

    parts: dict[int, tuple[str, ...]]
    dirs: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def ids(self) -> list[int]:
        return sorted(self.parts)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_ino, st.st_ctime_ns


def _numbered(directory: Path) -> list[int]:
    try:
        return [int(e.name) for e in os.scandir(directory) if e.name.isdigit()]
    except OSError:
        return []


def list_leftovers(run_dir: Path, prepared: Iterable[int] = ()) -> Leftovers:
    """Every job whose state is on the node: job dirs, the agent's prepared jobs, spools."""
    parts: dict[int, list[str]] = {}
    dirs: dict[int, tuple[int, int]] = {}
    for job in _numbered(run_dir / nodepaths.JOBS):
        ident = _identity(nodepaths.job_dir(run_dir, job))
        if ident is not None:
            parts.setdefault(job, []).append("job dir")
            dirs[job] = ident
    for job in prepared:
        parts.setdefault(job, []).append("prepared image")
    for job in _numbered(nodepaths.spools(run_dir)):
        parts.setdefault(job, []).append("phase spool")
    return Leftovers({j: tuple(p) for j, p in parts.items()}, dirs)


def find_stale(
    node: str, run_dir: Path, squeue: Path, prepared: Iterable[int] = ()
) -> tuple[Leftovers, NodeJobs, list[int]]:
    """(what is on the node, what Slurm runs here, the stale jobs). Listed first, asked
    second; :class:`~bootseer.slurmjobs.SlurmUnavailable` when Slurm cannot say."""
    found = list_leftovers(run_dir, prepared)
    if not found.parts:
        return found, NodeJobs({}), []
    slurm = node_jobs(node, squeue)
    return found, slurm, [j for j in found.ids if not slurm.runs(j)]


def clean(
    job: int,
    run_dir: Path,
    listed: Leftovers,
    release: Callable[[int], str] | None = None,
) -> str:
    """Clean up ``job`` as its epilog would; what was done, for the log line."""
    from bootseer.ckpt import mount
    from bootseer.phases.spool import Spool

    path = nodepaths.job_dir(run_dir, job)
    if job in listed.dirs and _identity(path) not in (listed.dirs[job], None):
        return "kept: its job dir changed since it was listed (a prolog of the same job?)"
    done: list[str] = []
    if release is not None:
        done.append(release(job))
    rec = mount.MountRecord.load(path / "ckpt")
    if rec is not None:
        res = mount.stop(rec)
        how = "daemon had died" if res.died else ("forced" if res.forced else "clean")
        done.append(f"checkpoint mount {rec.mountpoint} stopped ({how})")
    spool = Spool(run_dir, job)
    if spool.exists():
        spool.remove()
        done.append("phase spool removed")
    if path.exists():
        from bootseer.jobdir import JobDir

        JobDir(run_dir, job).remove()
        done.append("job dir removed (deps state with it)")
    return ", ".join(d for d in done if d) or "nothing left"


class Sweeper:
    """The agent's sweep: asks Slurm at most once per ``interval`` seconds, and only when
    some job's state is on the node; safe from any thread (one sweep at a time)."""

    def __init__(
        self,
        node: str,
        run_dir: Path,
        squeue: Path,
        interval: float,
        prepared: Callable[[], list[int]],
        release: Callable[[int], str],
        log: Callable[[str], None],
    ) -> None:
        self.node, self.run_dir, self.squeue = node, run_dir, squeue
        self.interval = interval
        self.prepared, self.release, self.log = prepared, release, log
        self.asked: float | None = None  # time.monotonic() of the last question to Slurm
        self.swept = 0  # jobs cleaned
        self.unanswered = 0  # sweeps that could not ask Slurm
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def due(self) -> bool:
        return self.interval > 0 and (
            self.asked is None or time.monotonic() - self.asked >= self.interval
        )

    def maybe(self) -> list[int]:
        """Sweep if due; the jobs swept."""
        if not self.due() or not self._lock.acquire(blocking=False):
            return []
        try:
            if not self.due():
                return []
            found = list_leftovers(self.run_dir, self.prepared())
            if not found.parts:
                return []  # nothing to ask Slurm about
            self.asked = time.monotonic()
            try:
                slurm = node_jobs(self.node, self.squeue)
            except SlurmUnavailable as exc:
                self.unanswered += 1
                self.log(f"sweep: cannot ask Slurm ({exc}); jobs {found.ids} kept")
                return []
            stale = [j for j in found.ids if not slurm.runs(j)]
            kept = [j for j in found.ids if j not in stale]
            if kept:
                self.log(f"sweep: Slurm runs jobs {kept} on {self.node}: kept")
            if not stale:
                return []
            for job in stale:
                state = slurm.states.get(job)
                why = f"Slurm: {state}" if state else f"Slurm does not run it on {self.node}"
                try:
                    what = clean(job, self.run_dir, found, self._release_if(job, found))
                except Exception as exc:  # one job's trouble must not stop the others
                    what = f"not cleaned: {exc!r}"
                self.log(f"sweep: job={job} ({why}; left: {', '.join(found.parts[job])}): {what}")
            self.swept += len(stale)
            return stale
        finally:
            self._lock.release()

    def _release_if(self, job: int, found: Leftovers) -> Callable[[int], str] | None:
        return self.release if "prepared image" in found.parts[job] else None

    def run(self) -> None:
        """The periodic sweep, until :meth:`close`; the first after a random part of the
        interval, so nodes started together do not ask Slurm together."""
        if self.interval <= 0:
            return
        wait = random.uniform(0.1, 1.0) * self.interval
        while not self._closed.wait(wait):
            self.maybe()
            wait = self.interval

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.run, name="agent-sweep", daemon=True)
        t.start()
        return t

    def close(self) -> None:
        self._closed.set()
