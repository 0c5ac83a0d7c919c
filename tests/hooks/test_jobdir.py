"""A job's directory on a node: what other users may see of it (nothing), and root's
writes into the one directory of it the job's user owns (never through her links).
The same on a real cluster: tests/plugin/test_envfile_slurm.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer import nodepaths
from bootseer.deps.jobstate import PrologState
from bootseer.errors import StepError
from bootseer.jobdir import JobDir


@pytest.fixture
def umask0() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def mode(p: Path) -> int:
    return p.lstat().st_mode & 0o7777


def test_the_job_dir_lets_users_through_but_shows_them_nothing(
    tmp_path: Path, umask0: None
) -> None:
    job = JobDir(tmp_path, 42).create()
    job.write_env({"BOOTSEER_DEPS_PREFIX": "/tmp/alices-secret-prefix"})
    assert mode(job.path) == 0o711  # through to deps/job/, no listing
    assert mode(job.path / nodepaths.JOB_ENV) == 0o600  # the plugin reads it as root
    assert mode(job.sub("ckpt")) == 0o700
    assert mode(job.sub("deps", mode=0o711)) == 0o711
    assert mode(job.sub("deps")) == 0o711  # made earlier in this job: left as it is
    assert job.read_env() == {"BOOTSEER_DEPS_PREFIX": "/tmp/alices-secret-prefix"}


def test_the_users_copy_of_the_deps_state_replaces_a_link_she_planted(
    tmp_path: Path, umask0: None
) -> None:
    """deps/job/ is the job user's: a link she puts at prolog.json is replaced by root's
    copy, and what it pointed at stays as it was."""
    victim = tmp_path / "shadow"
    victim.write_text("root's own file\n")
    user_dir = tmp_path / "deps" / "job"
    user_dir.mkdir(parents=True)
    (user_dir / nodepaths.DEPS_STATE).symlink_to(victim)
    state = PrologState(base="b" * 64, scope="user/alice", prefix="/tmp/p")
    state.write(user_dir / nodepaths.DEPS_STATE, mode=0o644)
    assert victim.read_text() == "root's own file\n"
    assert not (user_dir / nodepaths.DEPS_STATE).is_symlink()
    assert PrologState.read(user_dir / nodepaths.DEPS_STATE) == state
    assert mode(user_dir / nodepaths.DEPS_STATE) == 0o644
    root_copy = tmp_path / "deps" / nodepaths.DEPS_STATE
    state.write(root_copy)
    assert mode(root_copy) == 0o600
    assert [p.name for p in user_dir.iterdir()] == [nodepaths.DEPS_STATE]  # no temp left


MALLORY = 1003  # slurm-dev's user; any uid but root's would do


def test_the_jobs_dir_is_roots_alone_whatever_the_umask(tmp_path: Path, umask0: None) -> None:
    """The first prolog of a node makes ``<run_dir>/jobs``: under a umask of 0 it was
    0777, and any user could make (or link) the next job's directory before its prolog."""
    JobDir(tmp_path, 42).create()
    assert mode(tmp_path / nodepaths.JOBS) & 0o022 == 0


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_job_dir_another_user_made_first_is_refused_and_left_as_it_is(
    tmp_path: Path,
) -> None:
    """Mallory made job 43's directory first (a jobs dir she could write): the prolog
    refuses it (the job starts the ordinary way) rather than write the env file and the
    steps' records into a directory she owns."""
    jobs = tmp_path / nodepaths.JOBS
    jobs.mkdir()
    hers = jobs / "43"
    hers.mkdir(mode=0o777)
    hers.chmod(0o777)
    os.chown(hers, MALLORY, MALLORY)
    with pytest.raises(StepError, match="not root's"):
        JobDir(tmp_path, 43).create()
    assert mode(hers) == 0o777 and hers.stat().st_uid == MALLORY
    assert list(hers.iterdir()) == []


def test_a_link_at_the_job_dir_is_refused_and_its_target_not_chmodded(
    tmp_path: Path,
) -> None:
    """A link at the job dir's path: root's chmod followed it (to a home, /root...)."""
    target = tmp_path / "alices-home"
    target.mkdir(mode=0o700)
    target.chmod(0o700)
    jobs = tmp_path / nodepaths.JOBS
    jobs.mkdir()
    (jobs / "44").symlink_to(target)
    with pytest.raises(StepError, match="not root's"):
        JobDir(tmp_path, 44).create()
    assert mode(target) == 0o700


def test_a_jobs_dir_others_may_write_is_refused(tmp_path: Path) -> None:
    """``<run_dir>/jobs`` of another user's (or a link): nothing of a job goes there."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / nodepaths.JOBS).symlink_to(elsewhere)
    with pytest.raises(StepError, match="not a directory of root's"):
        JobDir(tmp_path, 45).create()
    assert list(elsewhere.iterdir()) == []


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="a tmpfs mount needs root")
def test_the_users_deps_dir_fills_a_tmpfs_of_its_own_not_run(tmp_path: Path) -> None:
    """deps/job/ is the one directory of the run dir (/run) a job's user may write: it
    filled /run, where slurmd, munge and every job's files live, without bound. Now a
    tmpfs of its own (as the phase spool), unmounted with the job dir."""
    from bootseer import mounts
    from bootseer.deps.step import USER_DIR_BYTES, _user_dir

    job = JobDir(tmp_path, 46).create()
    job.sub("deps", mode=0o711)
    user_dir = job.path / "deps" / "job"
    _user_dir(user_dir, MALLORY, MALLORY)
    try:
        assert mounts.is_mounted(user_dir)
        assert user_dir.stat().st_dev != job.path.stat().st_dev
        vfs = os.statvfs(user_dir)
        assert vfs.f_blocks * vfs.f_frsize == USER_DIR_BYTES
        st = user_dir.stat()
        assert (st.st_uid, st.st_gid, mode(user_dir)) == (MALLORY, MALLORY, 0o700)
        _user_dir(user_dir, MALLORY, MALLORY)  # a retried prolog: not mounted twice
        assert mounts.mounts_under(job.path) == [str(user_dir)]
    finally:
        job.remove()
    assert mounts.mounts_under(tmp_path) == []
    assert not job.path.exists()


def test_a_run_dir_that_is_the_admins_link_is_followed(tmp_path: Path) -> None:
    """``[paths] run_dir`` may be a link of the admin's (to a node-local disk): followed;
    ``jobs/`` below it never."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "run").symlink_to(real)
    job = JobDir(tmp_path / "run", 47).create()
    assert (real / nodepaths.JOBS / "47").is_dir() and job.path.is_dir()
