"""Issue 22, item 2: a file:// store whose root is missing (its shared filesystem not
mounted on the node) stays missing. Before, the first bootseer job's hooks made the
directory on the node's root disk, doctor then passed, and the report said the job
ran without --bootseer."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from bootseer import mounts
from bootseer.config import SiteConfig
from bootseer.doctor import Node
from bootseer.doctor.store import check_store
from bootseer.errors import StoreError
from tests.conftest import TOP, to_toml

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="the hooks run as root (a tmpfs spool)"),
]


def hook(name: str, config: Path, deps: str) -> None:
    import subprocess

    env = {
        "BOOTSEER_CONFIG": str(config),
        "BOOTSEER_PYTHON": sys.executable,
        "SPANK_BOOTSEER_MODE": "on",
        "SPANK_BOOTSEER_DEPS": deps,
        "SLURM_JOB_ID": "4712",
        "SLURM_JOB_USER": "root",
        "SLURM_JOB_UID": str(os.getuid()),
        "SLURM_JOB_GID": str(os.getgid()),
        "SLURMD_NODENAME": "n1",
        "SLURM_NODELIST": "n1",
    }
    r = subprocess.run(
        [str(TOP / name / f"bootseer-{name}")], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr  # the job starts the ordinary way


def test_hooks_never_make_a_missing_store_root_and_doctor_fails(tmp_path: Path) -> None:
    shared = tmp_path / "shared"  # the mount point, its filesystem not mounted
    shared.mkdir()
    root = shared / "bootseer"
    config = tmp_path / "config.toml"
    config.write_text(
        to_toml(
            {
                "store": {"uri": f"file://{root}"},
                "paths": {
                    "run_dir": str(tmp_path / "run"),
                    "log_dir": str(tmp_path / "log"),
                    "cache_dir": str(tmp_path / "cache"),
                },
                "phases": {"background_flush": False, "submit_time": False},
            }
        )
    )
    config.chmod(0o644)
    deps = f"{tmp_path}/prefix,key={config}"
    try:
        hook("prolog", config, deps)
        hook("epilog", config, deps)
    finally:
        for spool in (tmp_path / "run" / "phases").glob("*"):
            if mounts.is_mounted(spool):
                mounts.umount(spool, lazy=True)
    assert list(shared.iterdir()) == []  # nothing made on the node's own disk
    log = (tmp_path / "log" / "n1.log").read_text()
    assert f"{root} does not exist: is its shared filesystem mounted here?" in log, log

    cfg = SiteConfig.from_mapping({"store": {"uri": f"file://{root}"}}, source=config)
    with pytest.raises(StoreError, match="is its shared filesystem mounted here"):
        cfg.store.open()
    check = check_store(Node("n1", tmp_path / "slurm.conf", config, cfg.for_node("n1")))
    assert check.status == "problem" and "does not exist" in check.detail
    assert list(shared.iterdir()) == []
