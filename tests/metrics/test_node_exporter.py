"""Debian's node_exporter, with only its textfile collector, serves what a real agent and
a real hook process wrote: no scrape error, the same values (loopback only)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import TEST_PORT_BASE
from tests.exporterkit import EXPORTER, node_exporter, scrape
from tests.imagekit import AgentProc, site_config

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.skipif(
        os.geteuid() != 0 or EXPORTER is None or not os.path.exists("/dev/fuse"),
        reason="needs root, /dev/fuse and prometheus-node-exporter (scripts/bootstrap)",
    ),
]
PORT = TEST_PORT_BASE + 90  # inside this checkout's reserved range, on loopback


def test_node_exporter_serves_the_agent_and_hook_files(base: Path) -> None:
    # Not under pytest's tmp dir: every root pytest session on the machine shares
    # /tmp/pytest-of-root and makes it 0700 again when it starts.
    textfiles = Path(tempfile.mkdtemp(prefix="bootseer-textfile-", dir="/tmp"))
    textfiles.chmod(0o755)
    config = site_config(base, "t1")
    config["metrics"] = {"textfile_dir": str(textfiles), "interval": 1}
    config["phases"] = {"background_flush": False, "submit_time": False}
    agent = AgentProc(base, "t1", config)
    try:
        agent.start()
        hook_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "BOOTSEER_CONFIG": str(agent.config_path),
            "SPANK_BOOTSEER_MODE": "on",
            "SLURMD_NODENAME": "t1",
            "SLURM_JOB_ID": "3",
            "SLURM_JOB_USER": "root",
            "SLURM_JOB_UID": "0",
            "SLURM_JOB_GID": "0",
            "SLURM_NODELIST": "t1",
        }
        for hook in ("prolog", "epilog"):
            subprocess.run(
                [sys.executable, "-m", "bootseer.hooks", hook], env=hook_env, check=True, timeout=60
            )
        # node_exporter does not run as root (Debian's runs as prometheus): here, nobody.
        with node_exporter(textfiles, PORT, base / "exporter.err"):
            got = scrape(PORT)
        assert got[("node_textfile_scrape_error", ())] == 0, (base / "exporter.err").read_text()
        assert got[("bootseer_agent_up", ())] == 1
        for hook in ("prolog", "epilog"):
            key = ("bootseer_hook_runs_total", (("hook", hook), ("outcome", "ok")))
            assert got[key] == 1, hook
        mtimes = {
            Path(dict(k[1])["file"]).name for k in got if k[0] == "node_textfile_mtime_seconds"
        }
        assert {"bootseer_agent.prom", "bootseer_hooks.prom"} <= mtimes
    finally:
        agent.stop()
        shutil.rmtree(textfiles, ignore_errors=True)
