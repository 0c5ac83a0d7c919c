"""The checkpoint quota through the door (a user's ``bootseer ckpt`` via the node agent,
which writes as root): alice's put past her quota is refused in one line that says
EDQUOT and what she holds, nothing of it is published or left on the targets, ``ckpt
usage`` shows her use and quota, ``ckpt rm`` frees it, and bob is unaffected. A real
agent and slurm-dev's users, no Slurm (the mount in a Slurm job:
``test_ckpt_quota_slurm.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer.ckpt.quota import user_bytes
from bootseer.store import open_store
from bootseer.units import iec
from tests.imagekit import AgentProc, site_config

from .test_door import UNIT, _users, as_user, pytestmark, weights

__all__ = ["pytestmark"]
QUOTA = 10 * UNIT


@pytest.fixture
def door(base: Path) -> Iterator[AgentProc]:
    _users()
    config = site_config(base, max_connections_per_user=4)
    for target in ("t1", "t2"):  # the site makes the targets' roots, never bootseer
        (base / target).mkdir()
    config["ckpt"] = {
        "targets": [f"file://{base}/t1", f"file://{base}/t2"],
        "unit_size": UNIT,
        "door": "any",  # no Slurm here: test_door_slurm.py has the default
        "quota": {"user": QUOTA},
        "quota_rescan": 3600.0,  # a count per put, and before refusing (docs/ckpt.md)
    }
    agent = AgentProc(base, "t1", config)
    try:
        yield agent.start()
    finally:
        agent.stop()


def _keys(base: Path, user: str) -> set[str]:
    return {o.key for t in ("t1", "t2") for o in open_store(f"file://{base}/{t}").list(user, True)}


def test_a_put_past_alices_quota_is_refused_and_bob_is_unaffected(
    base: Path, door: AgentProc
) -> None:
    stores = [open_store(f"file://{base}/{t}") for t in ("t1", "t2")]
    six, _ = weights(base, "alice", 6 * UNIT)
    r = as_user("alice", door, "put", str(six), "proj:a.pt")
    assert r.returncode == 0, r.stderr
    held = user_bytes(stores, "alice")
    before = _keys(base, "alice")

    r = as_user("alice", door, "put", str(six), "proj:b.pt")
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "would pass the ckpt.quota of user alice, user=640 KiB" in lines[0], r.stderr
    assert "EDQUOT" in lines[0] and "bootseer ckpt rm" in lines[0], r.stderr
    assert _keys(base, "alice") == before  # no manifest, no unit of b.pt
    r = as_user("alice", door, "ls", "proj")
    assert r.returncode == 0 and "a.pt" in r.stdout and "b.pt" not in r.stdout, r.stdout

    r = as_user("alice", door, "usage")
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("user alice"))
    assert iec(held) in row and iec(QUOTA) in row and iec(QUOTA - held) in row, r.stdout

    bob_file, _ = weights(base, "bob", 8 * UNIT)
    r = as_user("bob", door, "put", str(bob_file), "proj:b.pt")
    assert r.returncode == 0, r.stderr  # alice's full quota is not his
    r = as_user("bob", door, "usage")
    assert "user alice" not in r.stdout and "user bob" in r.stdout, r.stdout

    r = as_user("alice", door, "rm", "proj:a.pt")
    assert r.returncode == 0, r.stderr
    r = as_user("alice", door, "put", str(six), "proj:b.pt")
    assert r.returncode == 0, r.stderr
    assert "ckpt door: uid" in door.log_text() and "refused: " in door.log_text()
