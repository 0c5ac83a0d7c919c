"""scripts/bootstrap: two checkouts on one machine never share one venv by accident."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

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


def _path_without(tmp_path: Path, *names: str) -> str:
    """A PATH of one directory holding this machine's commands but ``names``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for d in ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        if not os.path.isdir(d):
            continue
        for entry in os.scandir(d):
            name = entry.name
            if name.startswith(names) or (bin_dir / name).exists():
                continue
            if os.access(entry.path, os.X_OK):
                (bin_dir / name).symlink_to(entry.path)
    return str(bin_dir)


def test_without_python3_the_check_says_the_fix_before_anything_else(tmp_path: Path) -> None:
    """Issue 22, item 3: on a bookworm without python3 (and, here, no apt-get to install
    it), bootstrap exited 1 with no output. Its check now names the fix at once."""
    env = {k: v for k, v in os.environ.items() if k != "BOOTSEER_PY"}
    env["PATH"] = _path_without(tmp_path, "python3", "apt-get")
    r = subprocess.run(
        [str(TOP / "scripts" / "bootstrap"), "--check"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,  # a check of seconds; the bound is a loaded machine's
    )
    assert r.returncode != 0
    assert "bootstrap: no python3 on PATH: apt-get install python3 python3-venv" in r.stderr
    r = subprocess.run(
        [str(TOP / "scripts" / "bootstrap"), "--check"],
        capture_output=True,
        text=True,
        env={**env, "BOOTSEER_PY": "/nonexistent/python3"},
        timeout=120,
    )
    assert r.returncode != 0
    assert "BOOTSEER_PY=/nonexistent/python3 is not an executable" in r.stderr


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="the check switches to an ordinary user")
def test_a_clone_ordinary_users_cannot_read_is_refused_before_pip() -> None:
    """A clone under /root (0700) failed after minutes of pip: the venv's bootseer is an
    editable install that every job user runs. The check says so first."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="bootseer-clone-", dir="/var/tmp"))
    try:
        base.chmod(0o755)  # what lies above is open to all: the 0700 home below is not
        _check_a_private_clone(base)
    finally:
        shutil.rmtree(base)


def _check_a_private_clone(base: Path) -> None:
    private = base / "root-home"
    private.mkdir(mode=0o700)
    clone = private / "bootseer"
    (clone / "scripts").mkdir(parents=True)
    (clone / "lib" / "bootseer").mkdir(parents=True)
    for name in ("scripts/bootstrap", "scripts/venv-path", "pyproject.toml"):
        shutil.copy2(TOP / name, clone / name)
    r = subprocess.run(
        [str(clone / "scripts" / "bootstrap"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0
    assert f"{clone} is not readable by ordinary users" in r.stderr
    assert "chmod o+rx" in r.stderr
    private.chmod(0o755)
    r = subprocess.run(
        [str(clone / "scripts" / "bootstrap"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "not readable by ordinary users" not in r.stderr, r.stderr


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="bootstrap runs as root")
def test_bootstrap_puts_bootseer_on_the_admins_path(tmp_path: Path) -> None:
    """The venv's bootseer was on no PATH after bootstrap: now a link in /usr/local/bin
    (BOOTSEER_BIN_DIR here); a link of another venv there is left as it is."""
    venv = os.environ.get("BOOTSEER_VENV")
    if not venv:
        pytest.skip("runs bootstrap on the suite's own venv ($BOOTSEER_VENV)")
    bin_dir = tmp_path / "bin"
    env = {**os.environ, "BOOTSEER_BIN_DIR": str(bin_dir)}
    cmd = [str(TOP / "scripts" / "bootstrap")]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    assert r.returncode == 0, r.stderr
    assert os.readlink(bin_dir / "bootseer") == f"{venv}/bin/bootseer"
    assert subprocess.run([bin_dir / "bootseer", "--help"], capture_output=True).returncode == 0
    (bin_dir / "bootseer").unlink()
    (bin_dir / "bootseer").symlink_to("/opt/elsewhere/bin/bootseer")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    assert r.returncode == 0, r.stderr
    assert os.readlink(bin_dir / "bootseer") == "/opt/elsewhere/bin/bootseer"
    assert "is not this checkout's" in r.stderr
