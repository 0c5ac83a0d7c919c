"""Debian's node_exporter, with only its textfile collector, serves what a real agent and
a real hook process wrote: no scrape error, the same values (loopback only)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import TEST_PORT_BASE
from tests.imagekit import AgentProc, site_config

EXPORTER = shutil.which("prometheus-node-exporter")
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or EXPORTER is None or not os.path.exists("/dev/fuse"),
    reason="needs root, /dev/fuse and prometheus-node-exporter (scripts/bootstrap)",
)
PORT = TEST_PORT_BASE + 90  # inside this checkout's reserved range, on loopback


def scrape(timeout: float = 20) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=5) as r:
                text = r.read().decode()
            break
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    return {
        (x.name, tuple(sorted(x.labels.items()))): x.value
        for fam in text_string_to_metric_families(text)
        for x in fam.samples
    }


def test_node_exporter_serves_the_agent_and_hook_files(base: Path) -> None:
    # Not under pytest's tmp dir: every root pytest session on the machine shares
    # /tmp/pytest-of-root and makes it 0700 again when it starts.
    textfiles = Path(tempfile.mkdtemp(prefix="bootseer-textfile-", dir="/tmp"))
    textfiles.chmod(0o755)
    config = site_config(base, "t1")
    config["metrics"] = {"textfile_dir": str(textfiles), "interval": 1}
    config["phases"] = {"background_flush": False, "submit_time": False}
    agent = AgentProc(base, "t1", config)
    exporter = None
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
        exporter = subprocess.Popen(
            [
                "setpriv",
                "--reuid=nobody",
                "--regid=nogroup",
                "--clear-groups",
                str(EXPORTER),
                "--collector.disable-defaults",
                "--collector.textfile",
                f"--collector.textfile.directory={textfiles}",
                f"--web.listen-address=127.0.0.1:{PORT}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(base / "exporter.err", "wb"),  # noqa: SIM115
        )
        got = scrape()
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
        if exporter is not None:
            exporter.terminate()
            exporter.wait(timeout=10)
        agent.stop()
        shutil.rmtree(textfiles, ignore_errors=True)
