"""Which processes of a node the benchmarks count as bootseer's (``benchkit.bootseer_procs``):
its root processes but Slurm's, and whatever they start, whatever its owner. A restore's
child drops to the job's user and runs ``tar`` under it; before, the benchmarks left that
CPU out of bootseer's (session 18: a restore's ``tar`` took 6.2 CPU-s in one cold start)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import TOP

sys.path.insert(0, str(TOP / "slurm-dev" / "bench"))

from benchkit import Proc, bootseer_procs, read_proc, role_in_tree, role_of

ALICE = 1001


SLURMD = Proc(10, 1, 0, "slurmd", 5, 0.1)
STEPD = Proc(20, 10, 0, "slurmstepd", 6, 0.1)
JOB = Proc(21, 20, ALICE, "python", 7, 9.0)
SQUASHFUSE = Proc(22, 21, ALICE, "squashfuse", 8, 2.0)
AGENT = Proc(30, 1, 0, "bootseer", 4, 10.0)
PROLOG = Proc(40, 10, 0, "python3", 9, 1.2)
RESTORE = Proc(41, 40, ALICE, "python3", 10, 0.4)
TAR = Proc(42, 41, ALICE, "tar", 11, 6.2)


def pids(procs: list[Proc]) -> set[int]:
    return {p.pid for p in procs}


def test_a_restores_user_child_and_its_tar_are_bootseers() -> None:
    procs = [SLURMD, STEPD, JOB, SQUASHFUSE, AGENT, PROLOG, RESTORE, TAR]
    assert pids(bootseer_procs(procs, set())) == {30, 40, 41, 42}


def test_the_jobs_processes_and_slurms_are_not() -> None:
    got = pids(bootseer_procs([SLURMD, STEPD, JOB, SQUASHFUSE], set()))
    assert got == set()


def test_a_child_whose_parent_has_exited_stays_bootseers() -> None:
    known: set[tuple[int, int]] = set()
    bootseer_procs([PROLOG, RESTORE, TAR], known)
    # the restore's child has exited; tar, reparented, is still counted
    orphan = Proc(TAR.pid, 1, ALICE, "tar", TAR.started, 7.0)
    assert pids(bootseer_procs([orphan], known)) == {TAR.pid}
    # a new process that reuses a known pid is not (its start time differs)
    reused = Proc(TAR.pid, 1, ALICE, "tar", TAR.started + 500, 0.1)
    assert bootseer_procs([reused], known) == []


def test_read_proc_reads_a_real_process() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        p = read_proc(child.pid)
        assert p is not None
        assert (p.pid, p.ppid, p.uid) == (child.pid, os.getpid(), os.getuid())
        assert p.comm.startswith("python") and p.started > 0 and p.cpu_s >= 0
    finally:
        child.communicate(b"")
    assert read_proc(child.pid) is None


def test_each_of_bootseers_command_lines_has_its_role() -> None:
    venv = "/opt/bootseer/venv/bin"
    assert role_of([f"{venv}/python3.11", f"{venv}/bootseer", "agent", "--node", "n1"]) == "agent"
    assert role_of([f"{venv}/python3", "-m", "bootseer.ckptd", "--identity-fd", "5"]) == "ckptd"
    assert role_of([f"{venv}/python3", "-m", "bootseer.hooks", "prolog"]) == "hooks"
    assert role_of(["tar", "-x", "--no-same-owner"]) is None
    assert role_of([f"{venv}/bootseer", "image", "show", "agent"]) is None  # a user's command


def test_a_process_under_the_prolog_counts_as_the_hooks() -> None:
    """A restore's child and its tar have command lines of their own: their role is
    their nearest ancestor's that has one (real processes, read from /proc)."""
    code = (
        "import subprocess, sys; "
        "c = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read()'], "
        "stdin=subprocess.PIPE); print(c.pid, flush=True); sys.stdin.read(); "
        "c.communicate(b'')"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code, "-m", "bootseer.hooks", "prolog"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        procs = [p for p in (read_proc(parent.pid), read_proc(child_pid)) if p is not None]
        by_pid = {p.pid: p for p in procs}
        assert role_in_tree(by_pid[child_pid], by_pid, {}) == "hooks"
        me = Proc(os.getpid(), os.getppid(), 0, "python", 1, 0.0)
        assert role_in_tree(me, by_pid, {}) == "other"
        # A parent seen before, its role known (pids past pid_max: no /proc entry, no
        # command line of their own to read).
        daemon = Proc(1 << 23, 1, 0, "python3", 50, 1.0)
        child = Proc((1 << 23) + 1, daemon.pid, 0, "python3", 51, 0.1)
        known = {(daemon.pid, daemon.started): "ckptd"}
        assert role_in_tree(child, {daemon.pid: daemon}, known) == "ckptd"
        assert role_in_tree(child, {daemon.pid: daemon}, {}) == "other"
    finally:
        parent.communicate(b"")
