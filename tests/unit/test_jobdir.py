"""A job's directory on a node: what other users may see of it (nothing), and root's
writes into the one directory of it the job's user owns (never through her links).
The same on a real cluster: tests/integration/test_envfile_slurm.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer import nodepaths
from bootseer.deps.jobstate import PrologState
from bootseer.hooks.jobdir import JobDir


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
