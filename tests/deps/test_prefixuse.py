"""A prefix in use: no restore replaces the tree a running job of the user on the node has
in place (it would change that job's dependencies under it); the same snapshot is shared,
and once the job ended (its epilog ran, or Slurm says so) the restore goes on."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from bootseer.config import SiteConfig
from bootseer.deps import prefixuse, step
from bootseer.errors import StepError
from bootseer.jobdir import JobDir
from bootseer.stepapi import StepCall

from .conftest import USER_A, USER_B, fake_squeue, needs_root, site, step_call
from .test_oldtree import captured
from .test_steps import deps_run_in_job, write_site

pytestmark = pytest.mark.root


def with_squeue(scratch: Path, cfg: SiteConfig) -> SiteConfig:
    """The site with a ``squeue`` that prints ``squeue.out`` (what Slurm runs on the node)."""
    fake = fake_squeue(scratch)
    return dataclasses.replace(cfg, phases=dataclasses.replace(cfg.phases, squeue=fake))


def slurm_runs(scratch: Path, text: str) -> None:
    (scratch / "squeue.out").write_text(text)


def two_snapshots(scratch: Path) -> tuple[SiteConfig, Path, str]:
    """v1 and v2 in the store; the prefix holds v2 (stamped by the job that installed it),
    and the key file says v2. The site (with a fake ``squeue``), the prefix, the spec."""
    needs_root()
    cfg = with_squeue(scratch, site(scratch))
    prefix = scratch / "env"
    spec = f"{prefix},key=req.txt"
    for n, v in ((1, "v1"), (2, "v2")):
        shutil.rmtree(prefix, ignore_errors=True)
        (scratch / "req.txt").write_text(f"{v}\n")
        call = step_call(scratch, cfg, job_id=n, uid=USER_A, user="ada", deps=spec)
        captured(scratch, call, prefix, v)
    return cfg, prefix, spec


def job(scratch: Path, cfg: SiteConfig, job_id: int, spec: str, uid: int = USER_A) -> StepCall:
    return step_call(scratch, cfg, job_id=job_id, uid=uid, user="ada", deps=spec)


def mod(prefix: Path) -> str:
    return (prefix / "lib" / "pkg" / "mod.py").read_text()


def test_no_restore_replaces_a_prefix_a_running_job_uses(scratch: Path) -> None:
    cfg, prefix, spec = two_snapshots(scratch)
    a = job(scratch, cfg, 10, spec)
    r = step.prolog(a)  # A shares v2, in place
    assert r.outcome == "ok" and "already in" in r.detail, r.detail
    slurm_runs(scratch, "10 RUNNING\n")

    (scratch / "req.txt").write_text("v2\n")
    r = step.prolog(job(scratch, cfg, 11, spec))  # the same snapshot: shared as before
    assert r.outcome == "ok" and "already in" in r.detail, r.detail
    JobDir(cfg.for_node("n1").paths.run_dir, 11).remove()

    (scratch / "req.txt").write_text("v1\n")
    b = job(scratch, cfg, 12, spec)
    with pytest.raises(StepError) as err:
        step.prolog(b)
    why = str(err.value)
    assert why.startswith(f"{prefix} on n1 is in use by job 10 (Slurm: RUNNING): "), why
    assert "installs the ordinary way" in why, why
    assert mod(prefix) == "v2"  # A's tree, in place and whole
    assert not list(scratch.glob(".env.bootseer-*"))

    step.epilog(a)
    JobDir(cfg.for_node("n1").paths.run_dir, 10).remove()  # A ended
    r = step.prolog(job(scratch, cfg, 13, spec))
    assert r.outcome == "ok" and "restored" in r.detail, r.detail
    assert mod(prefix) == "v1"


def test_a_job_whose_epilog_did_not_end_blocks_only_while_slurm_runs_it(scratch: Path) -> None:
    """A's job dir is left (its epilog was killed): Slurm's word decides; Slurm that cannot
    be asked keeps the prefix (refused, saying why); another user's job naming the path
    does not count."""
    cfg, prefix, spec = two_snapshots(scratch)
    step.prolog(job(scratch, cfg, 20, spec))  # A, never to run its epilog
    with pytest.raises(StepError):
        step.prolog(job(scratch, cfg, 21, spec, uid=USER_B))  # not B's prefix: refused as ever

    (scratch / "req.txt").write_text("v1\n")
    blind = dataclasses.replace(
        cfg, phases=dataclasses.replace(cfg.phases, squeue=scratch / "no-squeue")
    )  # Slurm cannot be asked
    with pytest.raises(StepError) as err:
        step.prolog(job(scratch, blind, 22, spec))
    assert "job 20 (Slurm could not say whether it still runs" in str(err.value), err.value
    assert "job 21" not in str(err.value), err.value
    assert mod(prefix) == "v2"

    slurm_runs(scratch, "20 COMPLETED\n")  # A ended, listed for MinJobAge; 22 gone
    users = prefixuse.running_users(
        cfg.for_node("n1").paths.run_dir,
        str(prefix),
        USER_A,
        23,
        node="n1",
        squeue=cfg.phases.squeue,
        timeout=5,
    )
    assert users == []
    r = step.prolog(job(scratch, cfg, 23, spec))
    assert r.outcome == "ok" and "restored" in r.detail, r.detail
    assert mod(prefix) == "v1"


def test_deps_run_keeps_a_restored_tree_another_running_job_uses(scratch: Path) -> None:
    """A and B share the snapshot in the prefix; B's ``deps run`` has another command (a
    key of its own): it installs into the tree in place while A runs (main set A's tree
    aside), and sets it aside as before once Slurm no longer runs A."""
    needs_root()
    prefix, spec = scratch / "env", f"{scratch / 'env'},key=req.txt"
    (scratch / "req.txt").write_text("x\n")
    write_site(scratch)
    cfg = site(scratch)
    v1 = ["sh", "-c", f"mkdir -p {prefix}/lib && echo v1 > {prefix}/lib/a.py"]
    first = step_call(scratch, cfg, job_id=31, uid=0, user="root", deps=spec)
    step.prolog(first)
    assert deps_run_in_job(scratch, first, v1).returncode == 0
    assert "captured" in step.epilog(first).detail
    JobDir(first.cfg.paths.run_dir, 31).remove()
    shutil.rmtree(prefix)

    a = step_call(scratch, cfg, job_id=32, uid=0, user="root", deps=spec)
    assert "restored" in step.prolog(a).detail
    b = step_call(scratch, cfg, job_id=33, uid=0, user="root", deps=spec)
    assert "already in" in step.prolog(b).detail
    inode = prefix.stat().st_ino
    slurm_runs(scratch, "32 RUNNING\n33 RUNNING\n")
    v2 = ["sh", "-c", f"echo v2 > {prefix}/lib/b.py"]
    out = deps_run_in_job(scratch, b, v2)
    assert out.returncode == 0, out.stderr
    assert "job 32 (Slurm: RUNNING) runs with it" in out.stderr, out.stderr
    assert "in place" in out.stderr and "not captured" in out.stderr, out.stderr
    assert prefix.stat().st_ino == inode and not list(scratch.glob(".env.bootseer-old-*"))

    slurm_runs(scratch, "32 COMPLETED\n33 RUNNING\n")
    v3 = ["sh", "-c", f"mkdir -p {prefix}/lib && echo v3 > {prefix}/lib/a.py"]
    out = deps_run_in_job(scratch, b, v3)
    assert "reinstalling" in out.stderr, out.stderr
    (old,) = scratch.glob(".env.bootseer-old-*")
    assert (old / "env" / "lib" / "a.py").read_text() == "v1\n"
