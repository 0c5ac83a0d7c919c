"""The install serves every user: job tasks run the venv's `bootseer` as the job's user."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root"),
]


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


def test_a_build_dir_another_user_holds_is_refused_before_a_wheel_is_built(
    tmp_path: Path,
) -> None:
    """The default build dir, /var/tmp/bootseer-install, is a name any user of the admin
    machine can take first: mallory made it hers, and root's install built the wheels in
    her directory (or took hers, stamped as this checkout's), then put them on every node,
    whose hooks run that venv as root. Now the install refuses it, as it does a 0777
    directory above the build dir; a directory of root's, 0700, is used."""
    import pwd

    from bootseer.install.bundle import BuildError, build, own_build_dir

    mallory = pwd.getpwnam("mallory") if _has("mallory") else pwd.getpwnam("nobody")
    base = tmp_path / "var-tmp"
    base.mkdir()
    base.chmod(0o1777)
    hers = base / "bootseer-install"
    hers.mkdir()
    os.chown(hers, mallory.pw_uid, mallory.pw_gid)
    (hers / "wheels").mkdir()
    os.chown(hers / "wheels", mallory.pw_uid, mallory.pw_gid)
    with pytest.raises(BuildError, match="is not yours alone"):
        build(hers)
    assert sorted(p.name for p in hers.iterdir()) == ["wheels"]  # nothing built there
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(BuildError, match=f"{open_dir} .*not yours alone"):
        own_build_dir(open_dir / "build")
    mine = base / "root-build"
    own_build_dir(mine)
    assert oct(os.stat(mine).st_mode & 0o777) == "0o700"


def _has(user: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True
