"""The hooks against a store that hangs: SeaweedFS paused with SIGSTOP, so connections
open and requests go unanswered. The hooks run as slurmd runs them (the script, the
environment of a job); everything they do, records included, ends by their deadline,
since a hook slurmd kills at PrologEpilogTimeout drains the node."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer import mounts
from tests.conftest import TOP, devcluster, to_toml

pytestmark = pytest.mark.s3

DEADLINE = 6.0
STARTUP = 10.0  # the interpreter, the config, pyarrow's import, on a busy 2-core machine
# What a hook may take past its deadline, by its own clock (which starts once its
# interpreter has: a busy machine's slow start is not the hook's overrun), to end.
OVERRUN = 3.0


def hook(name: str, config: Path) -> subprocess.CompletedProcess[str]:
    env = {
        "BOOTSEER_CONFIG": str(config),
        "BOOTSEER_PYTHON": sys.executable,
        "SPANK_BOOTSEER_MODE": "on",
        "SLURM_JOB_ID": "4711",
        "SLURM_JOB_USER": "root",
        "SLURM_JOB_UID": str(os.getuid()),
        "SLURM_JOB_GID": str(os.getgid()),
        "SLURMD_NODENAME": "n1",
        "SLURM_NODELIST": "n1",
    }
    return subprocess.run(
        [str(TOP / name / f"bootseer-{name}")],
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE + STARTUP + 30,  # a hook that hangs on the store
    )


def test_hooks_end_by_their_deadline_when_the_store_hangs(
    s3_store: devcluster.Cluster, tmp_path: Path
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        to_toml(
            {
                "store": {
                    "uri": s3_store.store_uri(),
                    "secrets_file": str(s3_store.secrets_file),
                },
                "paths": {"run_dir": str(tmp_path / "run"), "log_dir": str(tmp_path / "log")},
                "hooks": {"prolog_deadline": DEADLINE, "epilog_deadline": DEADLINE},
                # the prolog writes its records inline too, so both hooks meet the store
                "phases": {"background_flush": False, "submit_time": False},
            }
        )
    )
    weed = s3_store.alive("weed")
    assert weed
    r = hook("prolog", config)  # the store answers: the records are written
    assert r.returncode == 0, r.stderr
    log = tmp_path / "log" / "n1.log"
    assert "phase records not written" not in log.read_text()

    os.kill(weed, signal.SIGSTOP)
    try:
        for name in ("epilog", "prolog"):
            r = hook(name, config)
            assert r.returncode == 0, r.stderr
            lines = [ln for ln in log.read_text().splitlines() if f" {name} " in ln]
            assert any("phase records not written: no answer from the store" in ln for ln in lines)
            done = re.search(r"done secs=([0-9.]+) exit=0$", lines[-1])
            assert done is not None and float(done.group(1)) < DEADLINE + OVERRUN, lines[-1]
    finally:
        os.kill(weed, signal.SIGCONT)
        # The last prolog's job never gets its epilog: its phase spool (a tmpfs of its
        # own) stays mounted, as on a node until the stale-spool sweep; not under pytest's
        # directories, which it prunes by removing.
        for spool in (tmp_path / "run" / "phases").iterdir():
            if mounts.is_mounted(spool):
                mounts.umount(spool, lazy=True)
