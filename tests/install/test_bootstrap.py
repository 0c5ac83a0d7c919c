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


def _venv_path(default: Path, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "BOOTSEER_VENV"}
    r = subprocess.run(
        [str(TOP / "scripts" / "venv-path")],
        capture_output=True,
        text=True,
        check=True,
        env={**clean, "BOOTSEER_VENV_DEFAULT": str(default), **env},
    )
    return r.stdout.strip()


def test_a_second_checkout_gets_a_venv_of_its_own_by_default(tmp_path: Path) -> None:
    """A second clone on the machine (CI's beside a developer's) must neither fail nor
    repoint the first clone's default venv: it defaults to a venv of its own."""
    default = tmp_path / "venv"
    default.mkdir()
    stamp = default / ".bootseer-installed"
    assert _venv_path(default) == str(default)  # nobody's yet
    stamp.write_text(f"{TOP} 0123456789abcdef /usr/bin/python3\n")
    assert _venv_path(default) == str(default)  # ours
    other = tmp_path / "other-clone"
    other.mkdir()
    stamp.write_text(f"{other} 0123456789abcdef /usr/bin/python3\n")
    own = _venv_path(default)
    assert own.startswith(f"{default}-") and own != str(default)
    assert _venv_path(default) == own  # stable
    assert _venv_path(default, BOOTSEER_VENV="/x/venv") == "/x/venv"  # asked for: as asked
    other.rmdir()
    assert _venv_path(default) == str(default)  # the other clone is gone: the default again
