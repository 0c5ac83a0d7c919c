"""scripts/bootstrap: two checkouts on one machine never share one venv by accident."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

TOP = Path(__file__).resolve().parents[2]


def test_a_venv_of_another_checkout_is_refused_not_repointed(tmp_path: Path) -> None:
    other = tmp_path / "other-clone"
    other.mkdir()
    venv = tmp_path / "venv"
    venv.mkdir()
    stamp = venv / ".bootseer-installed"
    stamp.write_text(f"{other} 0123456789abcdef /usr/bin/python3\n")
    r = subprocess.run(
        [str(TOP / "scripts" / "bootstrap")],
        capture_output=True,
        text=True,
        env={**os.environ, "BOOTSEER_VENV": str(venv)},
    )
    assert r.returncode == 1
    assert f"{venv} is the install of another checkout, {other}" in r.stderr
    assert "BOOTSEER_VENV=" in r.stderr
    assert stamp.read_text() == f"{other} 0123456789abcdef /usr/bin/python3\n"
    assert sorted(p.name for p in venv.iterdir()) == [".bootseer-installed"]
