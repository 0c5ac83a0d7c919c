"""The hooks' real processes (``python -m bootseer.hooks``, and the background flush the
prolog starts) load pyarrow without NumPy: pyarrow imports NumPy wherever it is
installed, half of its import's CPU, in every hook of every job on every node
(bootseer.nonumpy; issue 20)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer import mounts
from bootseer.phases.spool import Spool
from tests.conftest import to_toml
from tests.importtime import imported

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="the hooks run as root"),
]


def hook_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "store").mkdir(exist_ok=True)  # the site makes the store's root
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        to_toml(
            {
                "store": {"uri": f"file://{tmp_path}/store"},
                "paths": {
                    "run_dir": f"{tmp_path}/run",
                    "cache_dir": f"{tmp_path}/cache",
                    "log_dir": f"{tmp_path}/log",
                },
                # inline: the prolog writes its rows itself, so it opens the store
                "phases": {"background_flush": False, "submit_time": False},
            }
        )
    )
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "BOOTSEER_CONFIG": str(cfg),
        "SPANK_BOOTSEER_MODE": "on",  # --bootseer, no technique: the phase rows only
        "SLURMD_NODENAME": "t1",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_USER": "root",
        "SLURM_JOB_UID": "0",
        "SLURM_JOB_GID": "0",
        "SLURM_NODELIST": "t1",
    }


def unmount_under(tmp_path: Path) -> None:
    """A prolog's phase spool is a tmpfs: none may outlive the test."""
    for line in Path("/proc/mounts").read_text().splitlines():
        where = line.split()[1]
        if where.startswith(f"{tmp_path}/") and mounts.is_mounted(where):
            mounts.umount(where, lazy=True)


def run(cmd: list[str], env: dict[str, str]) -> set[str]:
    r = subprocess.run(
        [sys.executable, "-X", "importtime", *cmd],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return imported(r.stderr)


def test_prolog_flush_and_epilog_load_pyarrow_without_numpy(tmp_path: Path) -> None:
    env = hook_env(tmp_path)
    try:
        prolog = run(["-m", "bootseer.hooks", "prolog"], env)
        spool = Spool(tmp_path / "run", 7)
        assert spool.exists()
        flush = run(["-m", "bootseer.phases.flush", "--marks", str(spool.path)], env)
        epilog = run(["-m", "bootseer.hooks", "epilog"], env)
    finally:
        unmount_under(tmp_path)
    assert list((tmp_path / "store").rglob("*.parquet")), "no phase rows written"
    for name, mods in (("prolog", prolog), ("flush", flush), ("epilog", epilog)):
        assert "pyarrow.fs" in mods, name  # it did open the store
        assert "numpy" not in mods, name
        # Rows go to Parquet without pyarrow.compute (0.04 CPU-s to import: its wrappers)
        assert "pyarrow.compute" not in mods, name


def test_a_flush_runs_at_background_priority(tmp_path: Path) -> None:
    # The early flushes only make a running job visible sooner: nice 19, as the agent's
    # fill, so that they take no CPU the node's start needs (issue 20).
    env = hook_env(tmp_path)
    code = (
        "import os, runpy, sys\n"
        "sys.argv[1:] = ['--marks', sys.argv[1]]\n"
        "try:\n"
        "    runpy.run_module('bootseer.phases.flush', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    print(exc.code, os.getpriority(os.PRIO_PROCESS, 0))\n"
    )
    try:
        run(["-m", "bootseer.hooks", "prolog"], env)
        spool = Spool(tmp_path / "run", 7)
        r = subprocess.run(
            [sys.executable, "-c", code, str(spool.path)], env=env, capture_output=True, text=True
        )
    finally:
        unmount_under(tmp_path)
    assert r.stdout.split() == ["0", "19"], r.stderr
