"""Old trees off the job's path: a replacing restore (or ``deps run`` discarding another
command's restore) sets the old tree aside and returns; the epilog deletes it, as the
job's user, with whatever a crashed run left beside the prefix."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from bootseer.deps import oldtree, step
from bootseer.jobdir import JobDir
from bootseer.stepapi import StepCall

from .conftest import USER_A, USER_B, needs_root, site, step_call
from .test_steps import installed

pytestmark = pytest.mark.root


def holders(prefix: Path) -> list[Path]:
    return sorted(
        p for p in prefix.parent.iterdir() if p.name.startswith(f".{prefix.name}.bootseer-old-")
    )


def captured(scratch: Path, call: StepCall, prefix: Path, marker: str) -> None:
    """A job that installs into ``prefix`` (``marker`` in its ``lib/pkg/mod.py``) and whose epilog
    captures it and stamps the prefix as the job's."""
    step.prolog(call)
    installed(call, prefix)
    (prefix / "lib" / "pkg" / "mod.py").write_text(marker)  # a name the record holds
    r = step.epilog(call)
    assert "captured" in r.detail, r.detail
    JobDir(call.cfg.paths.run_dir, call.ctx.job_id).remove()  # the hook's last act


def test_a_replacing_restore_leaves_the_old_tree_to_the_epilog(scratch: Path) -> None:
    """The prefix holds snapshot v2 (this node's last job); the next job's key files give
    v1: the prolog restores v1 over it and returns with v2's tree still there, set aside;
    the job's epilog deletes it (main deleted it inside the prolog's restore)."""
    needs_root()
    cfg = site(scratch)
    prefix = scratch / "env"
    spec = f"{prefix},key=req.txt"
    (scratch / "req.txt").write_text("v1\n")
    captured(
        scratch, step_call(scratch, cfg, job_id=1, uid=USER_A, user="ada", deps=spec), prefix, "v1"
    )
    shutil.rmtree(prefix)
    (scratch / "req.txt").write_text("v2\n")
    captured(
        scratch, step_call(scratch, cfg, job_id=2, uid=USER_A, user="ada", deps=spec), prefix, "v2"
    )
    assert not holders(prefix)

    (scratch / "req.txt").write_text("v1\n")
    third = step_call(scratch, cfg, job_id=3, uid=USER_A, user="ada", deps=spec)
    r = step.prolog(third)
    assert r.outcome == "ok" and "restored" in r.detail, r.detail
    assert (prefix / "lib" / "pkg" / "mod.py").read_text() == "v1"
    (holder,) = holders(prefix)
    assert (
        holder / "env" / "lib" / "pkg" / "mod.py"
    ).read_text() == "v2"  # not deleted by the prolog
    assert holder.stat().st_uid == USER_A

    r = step.epilog(third)
    assert "deleted 1 old trees" in r.detail, r.detail
    assert not holders(prefix)
    assert (prefix / "lib" / "pkg" / "mod.py").read_text() == "v1"


def test_the_epilog_sweeps_leftovers_with_the_users_rights(scratch: Path) -> None:
    """Holders a crashed run left (one whole, one half deleted) go in any later epilog of
    a job with that prefix; what the job's user could not delete herself stays (a root
    directory inside one, another user's holder), as do names that are not holders."""
    needs_root()
    cfg = site(scratch)
    prefix = scratch / "env"

    def holder(suffix: str, uid: int) -> Path:
        h = scratch / f".env.bootseer-old-{suffix}"
        (h / "env" / "lib").mkdir(parents=True)
        (h / "env" / "lib" / "a.py").write_text("x\n")
        for p in [h, *h.rglob("*")]:
            os.chown(p, uid, uid, follow_symlinks=False)
        return h

    crashed = holder("crash001", USER_A)
    half = holder("crash002", USER_A)
    (half / "env" / "lib" / "a.py").unlink()
    rooted = holder("rooted01", USER_A)
    (rooted / "env" / "root").mkdir()
    (rooted / "env" / "root" / "f").write_text("root's\n")  # root-owned, in a 0755 root dir
    other = holder("otheruse", USER_B)
    not_ours = [scratch / ".env.bootseer-abcdefghi", scratch / ".env.bootseer-old-x.y"]
    for p in not_ours:
        p.mkdir()
        os.chown(p, USER_A, USER_A)

    call = step_call(scratch, cfg, job_id=5, uid=USER_A, user="ada", deps=str(prefix))
    step.prolog(call)
    r = step.epilog(call)
    assert "deleted 2 old trees" in r.detail and "(2 left)" in r.detail, r.detail
    assert not crashed.exists() and not half.exists()
    assert (rooted / "env" / "root" / "f").exists()  # root would have deleted it
    assert (other / "env" / "lib" / "a.py").exists()
    assert all(p.exists() for p in not_ours)


def test_set_aside_takes_a_new_holder_when_a_sweep_removed_the_empty_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another job's epilog may sweep the holder between its making and the rename."""
    prefix = tmp_path / "env"
    (prefix / "lib").mkdir(parents=True)
    made: list[str] = []
    real = tempfile.mkdtemp

    def mkdtemp(**kw: str) -> str:
        d: str = real(**kw)  # type: ignore[call-overload]
        made.append(d)
        if len(made) == 1:
            oldtree.sweep(str(prefix))  # the sweep, just then
        return d

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    holder = oldtree.set_aside(str(prefix))
    assert len(made) == 2 and holder == made[1]
    assert (Path(holder) / "env" / "lib").is_dir() and not prefix.exists()
    with pytest.raises(FileNotFoundError):
        oldtree.set_aside(str(prefix))  # nothing to set aside: no holder is left behind
    assert [p.name for p in tmp_path.iterdir()] == [Path(holder).name]


def extraction_dir(scratch: Path, name: str, uid: int) -> Path:
    """What a restore killed mid-extract leaves beside the prefix: part of a tree."""
    d = scratch / name
    (d / "lib" / "pkg").mkdir(parents=True)
    (d / "lib" / "pkg" / "big.so").write_bytes(b"\0" * 4096)
    for p in [d, *d.rglob("*")]:
        os.chown(p, uid, uid, follow_symlinks=False)
    return d


def test_a_killed_restores_extraction_dir_goes_with_the_next_epilog(scratch: Path) -> None:
    """A restore SIGKILLed mid-extract leaves ``.env.bootseer-XXXXXXXX`` (nothing removes
    it on main): the next epilog of the prefix retires it into a holder, with the prefix's
    lock held, and sweeps it as the user. Another user's, a file of that name and names
    not mkdtemp's (a holder's among them) are left alone."""
    needs_root()
    cfg = site(scratch)
    prefix = scratch / "env"
    killed = extraction_dir(scratch, ".env.bootseer-k1ll_ed0", USER_A)
    others = extraction_dir(scratch, ".env.bootseer-0therusr", USER_B)
    afile = scratch / ".env.bootseer-afile001"
    afile.write_text("x\n")
    os.chown(afile, USER_A, USER_A)
    longer = extraction_dir(scratch, ".env.bootseer-abcdefghi", USER_A)
    sibling = extraction_dir(scratch, ".envx.bootseer-abcdefgh", USER_A)
    foreign = extraction_dir(scratch, ".env.bootseer-old-0therusr", USER_B)  # B's holder
    (scratch / "env2").mkdir()  # the parent holds other things too

    call = step_call(scratch, cfg, job_id=7, uid=USER_A, user="ada", deps=str(prefix))
    step.prolog(call)
    r = step.epilog(call)
    assert "1 extraction dirs of killed restores set aside" in r.detail, r.detail
    assert "deleted 1 old trees" in r.detail and "(1 left)" in r.detail, r.detail
    assert not killed.exists()
    assert (others / "lib" / "pkg" / "big.so").exists()
    assert afile.read_text() == "x\n"
    for d in (longer, sibling, foreign):
        assert (d / "lib" / "pkg" / "big.so").exists(), d
    assert [p.name for p in holders(prefix)] == [foreign.name]


def test_an_extraction_dir_is_kept_while_a_restore_holds_the_prefix(scratch: Path) -> None:
    """With the prefix's lock held (a restore into it at work, writing its extraction
    dir), the epilog leaves the dir: it may be that restore's, not a killed one's."""
    needs_root()
    from bootseer.deps import nodecache

    cfg = site(scratch)
    prefix = scratch / "env"
    live = extraction_dir(scratch, ".env.bootseer-wr1t1ng_", USER_A)
    call = step_call(scratch, cfg, job_id=8, uid=USER_A, user="ada", deps=str(prefix))
    step.prolog(call)
    with nodecache.prefix_lock(call.cfg.paths.cache_dir, str(prefix), timeout=5):
        r = step.epilog(call)
    assert "1 extraction dirs beside" in r.detail and "kept" in r.detail, r.detail
    assert (live / "lib" / "pkg" / "big.so").exists()
    r = step.epilog(call)  # the restore done (or killed): the next epilog takes it
    assert "set aside" in r.detail and not live.exists(), r.detail
