"""Whether a ``--bootseer-deps`` prefix is the job user's alone.

Root restores into the prefix and captures what is in it into the user's own snapshot,
which later jobs of that user run. So nobody else may be able to put files there: the
prefix, if it exists, is a real directory of the job's user that only the user can
write, and every directory above it belongs to root or the user and is writable by no
one else, unless it has the sticky bit (``/tmp``: others can add names there but not
rename or remove the user's). A node-local prefix has a predictable path: another user
could create it first, as an empty world-writable directory, and wait for the install.

    >>> unsafe_reason("/", 0) is None
    True
    >>> unsafe_reason("/proc/1/../self", 0)
    "'/proc/1/../self' is not a normalized absolute path"
"""

from __future__ import annotations

import os
import stat


def unsafe_reason(prefix: str, uid: int) -> str | None:
    """Why ``prefix`` is not safe for ``uid`` to install into and root to capture from,
    or None when it is. A prefix that does not exist yet is checked by its parents."""
    prefix = prefix.rstrip("/") or "/"
    if not prefix.startswith("/") or os.path.normpath(prefix) != prefix:
        return f"{prefix!r} is not a normalized absolute path"
    try:
        st = os.lstat(prefix)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        return f"cannot inspect {prefix}: {exc.strerror}"
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            return f"{prefix} is a symbolic link"
        if not stat.S_ISDIR(st.st_mode):
            return f"{prefix} exists and is not a directory"
        if st.st_uid != uid:
            return f"{prefix} exists and belongs to uid {st.st_uid}, not the job's user"
        if st.st_mode & 0o022:
            return f"{prefix} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return _parents_reason(os.path.dirname(prefix), uid, depth=0)


def _parents_reason(path: str, uid: int, depth: int) -> str | None:
    """Every directory from ``/`` down to ``path``, following symbolic links."""
    if depth > 8:
        return f"too many symbolic links above the prefix (at {path})"
    parts = [p for p in path.split("/") if p]
    cur = "/"
    for i in range(len(parts) + 1):
        if i:
            cur = os.path.join(cur, parts[i - 1])
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            return None  # created later, by the user's install, as the user
        except OSError as exc:
            return f"cannot inspect {cur}: {exc.strerror}"
        if st.st_uid not in (0, uid):
            return f"{cur} belongs to uid {st.st_uid}, who could replace the prefix"
        if stat.S_ISLNK(st.st_mode):
            target = os.path.join(os.path.dirname(cur), os.readlink(cur))
            rest = os.path.join(os.path.normpath(target), *parts[i:])
            return _parents_reason(os.path.normpath(rest), uid, depth + 1)
        if not stat.S_ISDIR(st.st_mode):
            return f"{cur} is not a directory"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            mode = stat.S_IMODE(st.st_mode)
            return f"{cur} is writable by other users without the sticky bit (mode {mode:o})"
    return None
