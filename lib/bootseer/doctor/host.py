"""What the node gives the jobs' users: FUSE mounts, a Python bootseer runs on, and
``bootseer`` they can run."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tarfile
from pathlib import Path

from bootseer.doctor.node import Node
from bootseer.doctor.result import Check, ok, problem

PYTHON_MIN = (3, 11)  # pyproject's requires-python


def check_fuse(node: Node) -> Check:
    """Users can mount FUSE: /dev/fuse open to them, fusermount3 setuid root."""
    name = "fuse"
    try:
        st = os.stat("/dev/fuse")
    except OSError as exc:
        return problem(name, f"/dev/fuse: {exc.strerror}", "apt install fuse3; modprobe fuse")
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISCHR(st.st_mode) or mode & 0o006 != 0o006:
        return problem(
            name, f"/dev/fuse: mode {mode:04o}: users cannot mount", "chmod 0666 /dev/fuse"
        )
    found = shutil.which("fusermount3", path=node.user_path)
    if found is None:
        return problem(name, f"no fusermount3 on {node.user_path}", "apt install fuse3")
    st = os.stat(found)
    if st.st_uid != 0 or not st.st_mode & stat.S_ISUID:
        return problem(
            name, f"{found} is not setuid root: users cannot mount", f"chmod u+s {found}"
        )
    return ok(name, f"/dev/fuse {mode:04o}, {found} setuid root")


def check_python(node: Node) -> Check:
    """The interpreter is one bootseer runs on, with an extraction filter for deps restores
    (tarfile's own from 3.11.4, bootseer's copy of its rules before: Debian's 3.11.2)."""
    name = "python"
    version = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info[:2] < PYTHON_MIN:
        return problem(
            name,
            f"{node.python} is {version}: bootseer needs Python >= 3.11",
            "rebuild the venv on Python >= 3.11 (BOOTSEER_PY=... scripts/bootstrap)",
        )
    which = "tarfile's data filter" if hasattr(tarfile, "data_filter") else "bootseer's data filter"
    return ok(name, f"{version} with {which}: {node.python}")


def check_path(node: Node) -> Check:
    """Job users can run ``bootseer``: on their PATH, or the venv's executable by them."""
    name = "PATH"
    found = shutil.which("bootseer", path=node.user_path)
    if found is not None:
        blocked = others_cannot_run(Path(found))
        if blocked is None:
            return ok(name, f"{found}")
        return problem(name, f"{blocked}: not executable by others", f"chmod o+rx {blocked}")
    venv = node.python.parent / "bootseer"
    link = f"ln -s {venv} /usr/local/bin/"
    if not venv.exists():
        return problem(name, f"no bootseer on {node.user_path} nor at {venv}", link)
    blocked = others_cannot_run(venv) or others_cannot_run(Path(os.path.realpath(node.python)))
    if blocked is not None:
        return problem(name, f"{blocked}: not executable by others", f"chmod o+rx {blocked}")
    return ok(name, f"not on users' PATH, but they can run {venv}")


def others_cannot_run(path: Path) -> Path | None:
    """The first of ``path`` and its directories that others cannot pass or run, or None."""
    path = Path(os.path.abspath(path))
    for p in (*reversed(path.parents), path):
        try:
            mode = os.stat(p).st_mode
        except OSError:
            return p
        if not mode & stat.S_IXOTH or (p == path and not mode & stat.S_IROTH):
            return p
    return None
