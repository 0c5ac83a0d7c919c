"""The real hook process (``python -m bootseer.hooks``, as slurm.conf's Prolog runs it)
counts every run of a job that asked for bootseer: one that ran, one that failed before
its steps, and one whose site config would not load."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bootseer import mounts
from bootseer.metrics.hooks import FILE
from tests.conftest import to_toml

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="the hooks run as root"),
]


def value(path: Path, name: str, **labels: str) -> float:
    for fam in text_string_to_metric_families(path.read_text()):
        for s in fam.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return 0.0


def run_hook(tmp_path: Path, hook: str, config: str, **env: str) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(config)
    job_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "BOOTSEER_CONFIG": str(cfg),
        "SPANK_BOOTSEER_MODE": "on",  # --bootseer, no technique: no step to run
        "SLURMD_NODENAME": "t1",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_USER": "root",
        "SLURM_JOB_UID": "0",
        "SLURM_JOB_GID": "0",
        "SLURM_NODELIST": "t1",
        **env,
    }
    r = subprocess.run(
        [sys.executable, "-m", "bootseer.hooks", hook], env=job_env, capture_output=True, timeout=60
    )
    assert r.returncode == 0, r.stderr


def config(tmp_path: Path) -> dict[str, dict[str, object]]:
    (tmp_path / "store").mkdir(exist_ok=True)  # the site makes the store's root, never bootseer
    return {
        "store": {"uri": f"file://{tmp_path}/store"},
        "paths": {
            "run_dir": f"{tmp_path}/run",
            "cache_dir": f"{tmp_path}/cache",
            "log_dir": f"{tmp_path}/log",
        },
        "phases": {"background_flush": False, "submit_time": False},
        "metrics": {"textfile_dir": f"{tmp_path}/metrics"},
    }


def test_each_hook_run_is_counted_by_its_outcome(tmp_path: Path) -> None:
    try:
        counts(tmp_path)
    finally:  # a prolog's phase spool is a tmpfs: none may outlive the test
        for line in Path("/proc/mounts").read_text().splitlines():
            where = line.split()[1]
            if where.startswith(f"{tmp_path}/") and mounts.is_mounted(where):
                mounts.umount(where, lazy=True)


def counts(tmp_path: Path) -> None:
    good = to_toml(config(tmp_path))
    prom = tmp_path / "metrics" / FILE
    run_hook(tmp_path, "prolog", good)
    run_hook(tmp_path, "epilog", good)
    assert value(prom, "bootseer_hook_runs_total", hook="prolog", outcome="ok") == 1
    assert value(prom, "bootseer_hook_runs_total", hook="epilog", outcome="ok") == 1
    assert value(prom, "bootseer_hook_seconds_count", hook="prolog") == 1
    text = prom.read_text()  # zeros from the first run, so increase() sees the first one
    assert 'bootseer_hook_records_refused_total{hook="prolog",purpose="deps.ref"} 0.0' in text

    # The job's environment is not one the hook can use: a failed run, counted all the same.
    run_hook(tmp_path, "prolog", good, SLURM_JOB_USER="not a user")
    assert value(prom, "bootseer_hook_runs_total", hook="prolog", outcome="failed") == 1

    # A bad line in the site config: no step runs, and the run counts as config_error.
    bad = good.replace("[metrics]", "[metrics]\ninterval = 0")
    run_hook(tmp_path, "prolog", bad)
    run_hook(tmp_path, "epilog", bad)
    for hook in ("prolog", "epilog"):
        assert value(prom, "bootseer_hook_runs_total", hook=hook, outcome="config_error") == 1
        assert value(prom, "bootseer_hook_config_error", hook=hook) == 1
    log = (tmp_path / "log" / "t1.log").read_text()
    assert "outcome=config_error" in log and "metrics.interval" in log, log
    # Mended: the next run says so.
    run_hook(tmp_path, "prolog", good)
    run_hook(tmp_path, "epilog", good)
    assert value(prom, "bootseer_hook_config_error", hook="prolog") == 0
    assert value(prom, "bootseer_hook_runs_total", hook="prolog", outcome="ok") == 2
