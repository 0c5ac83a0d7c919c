"""mallory's job, read by others with `bootseer report`: what she writes reaches their
terminal as text, never as the terminal's own control sequences."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DevSlurm

pytestmark = pytest.mark.slurm

BOOTSEER = Path(sys.executable).parent / "bootseer"

# A clipboard write (OSC 52), a window title, a cleared screen, a C1 CSI, a fake line.
CONTROLS = "\x1b]52;c;cHduZWQ=\x07\x1b]0;pwned\x07\x1b[2J\x9b8m\nStartup 0.01 s"


def test_terminal_controls_in_mallorys_job_reach_no_readers_terminal(
    cluster: DevSlurm,
) -> None:
    """Her batch script's path and her failed mark's detail both hold terminal controls;
    alice's and root's `bootseer report` of her job show them written out (``\\x1b``).
    Before, both were printed as they were (rich escapes markup, not ESC)."""
    scripts = cluster.dir / "out" / "mallory"
    scripts.mkdir(parents=True, exist_ok=True)
    scripts.chmod(0o755)
    script = scripts / f"run{CONTROLS.replace(chr(10), ' ')}.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"srun {BOOTSEER} phase start first_step\n"
        f'srun {BOOTSEER} phase end first_step --outcome failed --detail "$(printf '
        "'\\033]52;c;cHduZWQ=\\007\\033]0;pwned\\007\\033[2J\\nStartup 0.01 s')\"\n"
    )
    script.chmod(0o755)
    job = cluster.sbatch("-N1", "--bootseer=on", str(script), user="mallory")
    assert cluster.wait(job) == "COMPLETED", cluster.output(job)
    (run,) = cluster.report_json(job)["runs"]
    assert "\x1b]52" in run["script"], run["script"]  # --json keeps her bytes, escaped by JSON
    details = [p["detail"] for n in run["nodes"] for p in n["phases"] if p["outcome"] == "failed"]
    assert any("\x1b]52" in d for d in details), details
    for reader in ("alice", "root"):
        r = subprocess.run(
            [*cluster.as_user(reader), str(BOOTSEER), "report", str(job)],
            env={**cluster.user_env(reader), "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        # Not a terminal: rich writes no controls of its own, so any ESC is hers.
        assert "\x1b" not in r.stdout and "\x07" not in r.stdout, (reader, r.stdout)
        assert "\x9b" not in r.stdout, reader
        assert "Why phases failed" in r.stdout and "\\x1b]52;c;cHduZWQ=" in r.stdout
        assert "Script " in r.stdout and "run\\x1b]52" in r.stdout
