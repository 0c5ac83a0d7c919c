"""Fixtures for the striped checkpoint tests: file:// targets, a namespace, a real mount."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer import mounts
from bootseer.ckpt import Namespace
from bootseer.ckpt import mount as ckpt_mount
from bootseer.store import open_store
from tests.sitekeys import KEYS, key_file

UNIT = 4096
STAGE_BYTES = 64 * UNIT  # node-local staging for writes out of order, per mount
JOB_UID = 65534  # nobody: the job's user in mount tests
OTHER_UID = 1  # daemon: another user who must not get in


@pytest.fixture
def targets(tmp_path: Path) -> list[str]:
    for i in range(3):  # made by the site, as a store's root (bootseer never makes one)
        (tmp_path / f"t{i}").mkdir(exist_ok=True)
    return [f"file://{tmp_path}/t{i}" for i in range(3)]


@pytest.fixture
def ns(targets: list[str]) -> Namespace:
    return Namespace(
        [open_store(u) for u in targets], "ada/test", unit_size=UNIT, read_ahead=4, max_inflight=4
    )


def write_site_config(
    tmp_path: Path,
    targets: list[str],
    monkeypatch: pytest.MonkeyPatch,
    unit_size: int = UNIT,
    read_ahead: int = 4,
) -> Path:
    """A site config over ``targets`` in ``tmp_path``, made the one ``BOOTSEER_CONFIG`` names."""
    path = tmp_path / "config.toml"
    quoted = ", ".join(f'"{t}"' for t in targets)
    path.write_text(
        f'[site]\nkey_file = "{key_file(tmp_path)}"\n'
        f'[paths]\ncache_dir = "{tmp_path}/cache"\n'
        f"[ckpt]\ntargets = [{quoted}]\nunit_size = {unit_size}\nread_ahead = {read_ahead}\n"
        f"stage_bytes = {STAGE_BYTES}\n"
    )
    monkeypatch.setenv("BOOTSEER_CONFIG", str(path))
    return path


@pytest.fixture
def site_config(tmp_path: Path, targets: list[str], monkeypatch: pytest.MonkeyPatch) -> Path:
    return write_site_config(tmp_path, targets, monkeypatch)


# A test that mounts: skipped without root or /dev/fuse (tests/conftest.py)
needs_fuse = pytest.mark.fuse


@pytest.fixture
def mount_root() -> Iterator[Path]:
    # Not under tmp_path: the job's user must be able to walk to the mountpoint.
    root = Path(tempfile.mkdtemp(prefix="bootseer-ckpt-test-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        for sub in root.iterdir():
            if mounts.is_mounted(sub):
                mounts.umount(sub, lazy=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def mounted(
    site_config: Path, mount_root: Path, tmp_path: Path
) -> Iterator[tuple[Path, ckpt_mount.MountRecord]]:
    """The namespace ``nobody/test`` mounted for uid 65534 by the real daemon."""
    mp = ckpt_mount.prepare_mountpoint(mount_root, "42", JOB_UID, JOB_UID)
    state = tmp_path / "state"
    state.mkdir()
    # 60 s bounds a hang: the daemon mounts within a second when the machine is idle
    rec = ckpt_mount.start(mp, "nobody/test", JOB_UID, JOB_UID, state, node="", timeout=60)
    try:
        yield mp, rec
    finally:
        ckpt_mount.stop(rec)


@pytest.fixture
def job_ns(targets: list[str]) -> Namespace:
    """The API's view of the mounted namespace, as an admin's (with the site key: what it
    writes the mount serves, and what the mount writes it checks)."""
    return Namespace([open_store(u) for u in targets], "nobody/test", unit_size=UNIT, keys=KEYS)
