"""Running a benchmark of ``slurm-dev/bench/`` from a test, at its smoke size, to the end."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import TOP


def run_bench(
    script: str, *args: str, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``slurm-dev/bench/<script> ARGS`` with the tests' interpreter; the test fails with the
    end of its output unless it exits 0."""
    r = subprocess.run(
        [sys.executable, str(TOP / "slurm-dev" / "bench" / script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, (
        f"{script} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    )
    return r
