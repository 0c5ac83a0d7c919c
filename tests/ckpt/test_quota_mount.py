"""The checkpoint quota through the real mount, as slurm-dev's alice and bob: a write
past alice's quota fails with EDQUOT at the write and at the close, the log she reads
says why, nothing of the dropped version is published or left, a file saved again under
its name may use its previous version's room, `rm` frees room, a new
daemon (a restart, another node) counts what the store holds, and bob is unaffected."""

from __future__ import annotations

import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer.ckpt import mount as ckpt_mount
from bootseer.ckpt.quota import user_bytes
from bootseer.store import open_store

from .conftest import UNIT, needs_fuse

pytestmark = needs_fuse
PY = "/usr/bin/python3"
QUOTA = 10 * UNIT
# Writes a file unit by unit; prints "ok", or the errno name of the first failure and
# of the close.
SAVE = f"""
import errno, os, sys
path, units = sys.argv[1], int(sys.argv[2])
f = open(path, "wb", buffering=0)
failed = "ok"
try:
    for i in range(units):
        f.write(os.urandom({UNIT}))
except OSError as exc:
    failed = "write:" + errno.errorcode[exc.errno]
try:
    f.close()
except OSError as exc:
    failed += " close:" + errno.errorcode[exc.errno]
print(failed)
"""


def _user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pytest.skip(f"needs slurm-dev's user {name} (slurm-dev/up creates them)")


@pytest.fixture
def quota_config(site_config: Path) -> Path:
    # Counts only at a mount's first write and before refusing: a count due mid-save (a
    # loaded machine) may count an upload twice and refuse early (docs/ckpt.md).
    text = site_config.read_text().replace("[ckpt]\n", "[ckpt]\nquota_rescan = 3600\n")
    site_config.write_text(text + f"[ckpt.quota]\nuser = {QUOTA}\n")
    return site_config


@pytest.fixture
def mount_as(quota_config: Path, mount_root: Path, tmp_path: Path) -> Iterator[object]:
    records: list[ckpt_mount.MountRecord] = []

    def start(user: str, job: str) -> Path:
        pw = _user(user)
        mp = ckpt_mount.prepare_mountpoint(mount_root, job, pw.pw_uid, pw.pw_gid)
        state = tmp_path / f"state-{job}"
        state.mkdir()
        rec = ckpt_mount.start(mp, f"{user}/q", pw.pw_uid, pw.pw_gid, state, node="", timeout=20)
        records.append(rec)
        return mp

    def stop(mp: Path) -> None:
        for rec in [r for r in records if Path(r.mountpoint) == mp]:
            ckpt_mount.stop(rec)
            records.remove(rec)

    start.stop = stop  # type: ignore[attr-defined]
    try:
        yield start
    finally:
        for rec in records:
            ckpt_mount.stop(rec)


def _as(user: str, *cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", *cmd],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _save(user: str, path: Path, units: int) -> str:
    r = _as(user, PY, "-c", SAVE, str(path), str(units))
    assert r.returncode == 0, r.stderr + _as(user, "cat", str(path.parent / ".bootseer.log")).stdout
    return r.stdout.strip()


def test_a_write_past_alices_quota_fails_with_edquot_and_bob_is_unaffected(
    mount_as: object, targets: list[str]
) -> None:
    start = mount_as
    stores = [open_store(t) for t in targets]
    alice = start("alice", "1")  # type: ignore[operator]
    assert _save("alice", alice / "a.pt", 6) == "ok"
    held = user_bytes(stores, "alice")
    assert 6 * UNIT < held < 7 * UNIT
    objects = {o.key for s in stores for o in s.list("alice", recursive=True)}

    # Six more units do not fit in ten: the fifth write fails, and so does the close.
    assert _save("alice", alice / "b.pt", 6) == "write:EDQUOT close:EDQUOT"
    assert not (alice / "b.pt").exists()  # never published
    assert {o.key for s in stores for o in s.list("alice", recursive=True)} == objects
    log = _as("alice", "cat", str(alice / ".bootseer.log")).stdout
    assert "alice/q:b.pt: 4.0 KiB more would pass the ckpt.quota of user alice" in log, log
    assert "user=40.0 KiB: it holds" in log, log
    assert "EDQUOT" in log and "new version dropped" in log, log
    r = _as("alice", "df", "--output=size,avail", "-B1", str(alice))
    size, avail = r.stdout.split()[-2:]
    assert int(size) == 0 and int(avail) == 0  # df in MiB blocks: under one MiB here

    # a.pt saved again under its name may use the room of the version it replaces.
    assert _save("alice", alice / "a.pt", 8) == "ok"
    assert 8 * UNIT < user_bytes(stores, "alice") < 9 * UNIT

    # bob's mount on the same targets: alice's full quota is not his.
    bob = start("bob", "2")  # type: ignore[operator]
    assert _save("bob", bob / "b.pt", 8) == "ok"

    # A new daemon (a restart, another node) counts what the store holds: still full.
    start.stop(alice)  # type: ignore[attr-defined]
    alice = start("alice", "3")  # type: ignore[operator]
    assert _save("alice", alice / "c.pt", 6) == "write:EDQUOT close:EDQUOT"
    # rm frees the room at once.
    r = _as("alice", "rm", str(alice / "a.pt"))
    assert r.returncode == 0, r.stderr
    assert _save("alice", alice / "c.pt", 6) == "ok"
    assert user_bytes(stores, "alice") < 7 * UNIT
    assert user_bytes(stores, "bob") > 8 * UNIT
