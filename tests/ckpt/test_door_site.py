"""Who may use the checkpoint door, and what a sparse file costs there (issue 21 item 4).

On main any user who reached a node agent's socket made root write a 2 GiB sparse file
(0 blocks of hers) to the targets in 16 s, with no job, under a 16 TiB default quota.
Now ``[ckpt] door`` says who may (by default: users with a job on the node, which Slurm
tells: ``test_doors_slurm.py`` has that on a real cluster), and a sparse file is
charged what it costs the targets: its size, not its blocks."""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bootseer.ckpt.quota import user_bytes
from bootseer.store import open_store
from tests.imagekit import AgentProc, site_config

from .test_door import UNIT, _users, as_user, home, pytestmark

__all__ = ["pytestmark"]
QUOTA = 10 * UNIT


@pytest.fixture
def door_with(base: Path) -> Iterator[Callable[..., AgentProc]]:
    _users()
    agents: list[AgentProc] = []

    def start(mode: str, **phases: str) -> AgentProc:
        config = site_config(base, max_connections_per_user=4)
        config["ckpt"] = {
            "targets": [f"file://{base}/t1", f"file://{base}/t2"],
            "unit_size": UNIT,
            "quota": {"user": QUOTA},
            "door": mode,
        }
        if phases:
            config["phases"] = phases
        agent = AgentProc(base, "t1", config)
        agents.append(agent)
        return agent.start()

    try:
        yield start
    finally:
        for a in agents:
            a.stop()


def sparse(base: Path, user: str, size: int) -> Path:
    path = home(base, user) / "sparse.bin"
    with open(path, "wb") as f:
        f.truncate(size)
    pw = pwd.getpwnam(user)
    os.chown(path, pw.pw_uid, pw.pw_gid)
    assert os.stat(path).st_blocks == 0  # it costs her nothing on her disk
    return path


def test_a_closed_door_refuses_every_user_in_one_line(
    base: Path, door_with: Callable[..., AgentProc]
) -> None:
    door = door_with("off")
    r = as_user("mallory", door, "put", str(sparse(base, "mallory", UNIT)), "x:a")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert 'door = "off"' in r.stderr, r.stderr
    assert user_bytes([open_store(f"file://{base}/t{i}") for i in (1, 2)], "mallory") == 0


def test_without_a_job_the_door_refuses_and_says_why(
    base: Path, door_with: Callable[..., AgentProc]
) -> None:
    """The default: a user with a job on the node. Where Slurm cannot be asked, nobody
    without a prepared job gets in, and the line says why."""
    door = door_with("job", squeue=str(base / "no-squeue"))
    r = as_user("mallory", door, "put", str(sparse(base, "mallory", UNIT)), "x:a")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "has no job on t1" in r.stderr and "Slurm could not say" in r.stderr, r.stderr
    assert user_bytes([open_store(f"file://{base}/t{i}") for i in (1, 2)], "mallory") == 0


def test_a_sparse_file_is_charged_its_size_not_its_blocks(
    base: Path, door_with: Callable[..., AgentProc]
) -> None:
    door = door_with("any")
    stores = [open_store(f"file://{base}/t{i}") for i in (1, 2)]
    r = as_user("mallory", door, "put", str(sparse(base, "mallory", 64 * UNIT)), "x:a")
    assert r.returncode == 1 and "EDQUOT" in r.stderr, r.stderr
    assert user_bytes(stores, "mallory") <= QUOTA  # what the targets hold of her
    r = as_user("mallory", door, "put", str(sparse(base, "mallory", 4 * UNIT)), "x:b")
    assert r.returncode == 0, r.stderr
    assert user_bytes(stores, "mallory") >= 4 * UNIT  # stored at its size
