"""The install serves every user: job tasks run the venv's `bootseer` as the job's user."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")


def test_an_unprivileged_user_runs_the_venvs_bootseer() -> None:
    r = subprocess.run(
        [*AS_NOBODY, str(BIN / "bootseer"), "--help"], capture_output=True, text=True, cwd="/"
    )
    assert r.returncode == 0, r.stderr
    assert "usage: bootseer" in r.stdout


def test_an_unprivileged_user_gets_the_same_interpreter() -> None:
    # A copied interpreter whose RUNPATH still names the original prefix would load
    # another libpython (Debian's 3.11.2) for a user who cannot reach the original.
    code = "import sys; print(sys.version)"
    r = subprocess.run(
        [*AS_NOBODY, str(BIN / "python3"), "-c", code], capture_output=True, text=True, cwd="/"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == sys.version
