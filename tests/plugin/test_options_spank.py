"""The SPANK plugin accepts at submit time exactly what bootseer.options accepts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.base.test_options import BAD, GOOD
from tests.conftest import DevSlurm

pytestmark = pytest.mark.slurm

CASES = [(kind, v, True) for kind, vs in GOOD.items() for v in vs] + [
    (kind, v, False) for kind, vs in BAD.items() for v in vs if v
]


@pytest.mark.parametrize(("kind", "value", "good"), CASES)
def test_plugin_and_library_agree(
    cluster: DevSlurm, base: Path, kind: str, value: str, good: bool
) -> None:
    option = f"--bootseer-{kind}={value}"
    # The syntax alone: a relative key= file is there (a missing one is refused too,
    # tests/plugin/test_submit_refusals_slurm.py).
    (base / "req.txt").write_text("numpy\n")
    r = subprocess.run(
        [*cluster.as_user("bob"), "sbatch", "--test-only", "-N1", option, "--wrap", "true"],
        env=cluster.user_env("bob"),
        cwd=base,
        capture_output=True,
        text=True,
    )
    if good:
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode != 0
        assert f"--bootseer-{kind}" in r.stderr
