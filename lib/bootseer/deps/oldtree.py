"""Old trees: a replaced prefix is set aside at once and deleted later, off the job's path.

When the prefix already holds another snapshot (new dependencies, same prefix path: a
common dev iteration), a restore swaps the new tree in and the old one has to go; so
does a restore that ``deps run`` finds made by another command. Deleting a real install
(torch: 1 GiB, 25,000 entries) took 0.7 s (journalled ext4) to 2.5 s (without a
journal), medians, of a replacing restore here, spent on bytes nobody needs while the
job waits (docs/deps.md, "Replacing a prefix"). So the
old tree is only renamed aside, into a fresh holder beside the prefix
(``.<name>.bootseer-old-XXXXXXXX/<name>``: one rename, on the same file system), and the
job's epilog removes the holders on every node (:func:`sweep`), this job's and any a
crashed or timed-out run left: nothing grows from one run to the next.

Nothing trusts a holder: the node's stamp names the prefix's own directory (device and
inode), never a holder, and no path bootseer hands a job points into one. The sweep
runs with the job user's rights (the epilog forks it through :mod:`bootseer.asuser`),
never root's: the trees are the user's, who could swap any directory in them for a
symlink while they are walked.

A restore killed mid-extract (SIGKILL: the prolog past ``PrologEpilogTimeout``, the OOM
killer) leaves its extraction directory beside the prefix,
``.<name>.bootseer-XXXXXXXX`` (:func:`bootseer.deps.archive.extract_snapshot`), which
nothing else removes: up to a snapshot's size of the user's disk for every such crash.
The epilog retires them into holders (:func:`retire`), with the node's lock of the
prefix held, so no restore into it is running, and the sweep deletes them with the rest.

    >>> holder_mark("venv")
    '.venv.bootseer-old-'
    >>> extraction_mark("venv")
    '.venv.bootseer-'
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator

SET_ASIDE_TRIES = 3
# What tempfile.mkdtemp adds to a holder's mark: 8 of [a-z0-9_]. Held to it, so that a
# sibling prefix named ``venv.bootseer-old-x`` is never taken for a holder of ``venv``.
_SUFFIX = re.compile(r"[a-z0-9_]{8}")


def holder_mark(name: str) -> str:
    """The start of every holder's name for a prefix named ``name``."""
    return f".{name}.bootseer-old-"


def extraction_mark(name: str) -> str:
    """The start of the name of every extraction directory of a prefix named ``name``
    (what :func:`bootseer.deps.archive.extract_snapshot` gives ``mkdtemp``)."""
    return f".{name}.bootseer-"


def is_named(name: str, mark: str) -> bool:
    """``name`` is ``mark`` and mkdtemp's suffix, nothing more: a holder's
    (:func:`holder_mark`) or an extraction directory's (:func:`extraction_mark`), never
    the other's (a holder's name is longer), nor a sibling prefix's.

    >>> is_named(".venv.bootseer-old-ab_12xyz", holder_mark("venv"))
    True
    >>> is_named(".venv.bootseer-old-ab.bootseer-x1y2z3w4", holder_mark("venv"))
    False
    >>> is_named(".venv.bootseer-ab_12xyz", extraction_mark("venv"))
    True
    >>> is_named(".venv.bootseer-old-ab_12xyz", extraction_mark("venv"))
    False
    """
    return name.startswith(mark) and _SUFFIX.fullmatch(name, len(mark)) is not None


def set_aside(prefix: str, tree: str | None = None) -> str:
    """Rename the tree at ``prefix`` (or ``tree``, beside it) into a fresh holder of
    ``prefix``; return the holder.

    An epilog's sweep of the same prefix (another job of the user, ending now) may remove
    the holder while it is still empty, between its making and the rename: the rename
    then fails with ENOENT and a new holder is made."""
    parent, name = os.path.split(prefix.rstrip("/"))
    source = prefix if tree is None else tree
    for attempt in range(SET_ASIDE_TRIES):
        holder = tempfile.mkdtemp(prefix=holder_mark(name), dir=parent)
        try:
            os.rename(source, os.path.join(holder, name))
        except FileNotFoundError:
            if os.path.isdir(holder) or attempt == SET_ASIDE_TRIES - 1:
                with contextlib.suppress(OSError):
                    os.rmdir(holder)
                raise  # the prefix itself is gone
            continue
        return holder
    raise AssertionError("unreachable")  # pragma: no cover


def beside(prefix: str) -> tuple[list[str], list[str]]:
    """The names of the holders and of the extraction directories beside ``prefix``, in
    one listing of its parent (none: the parent is gone or unreadable).

    Only names: the epilog lists them as root (a listing reads no user file and follows
    nothing but the prefix's parent path, which the prolog held to be safe) and forks a
    child only when there is something to remove, which is seldom."""
    parent, name = os.path.split(prefix.rstrip("/"))
    held, extracting = holder_mark(name), extraction_mark(name)
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return [], []
    return (
        [n for n in names if is_named(n, held)],
        [n for n in names if is_named(n, extracting)],
    )


def holders(prefix: str) -> list[str]:
    """The names of the holders beside ``prefix`` (:func:`beside`)."""
    return beside(prefix)[0]


def _own_dirs(parent: str, names: Iterable[str], mine: Callable[[str], bool]) -> Iterator[str]:
    """The paths of ``names`` in ``parent`` that pass ``mine`` (the name's shape) and are
    directories of this process's user; a sentinel ``""`` for each other one there
    (another user's, not a directory), for the caller to count as left."""
    me = os.geteuid()
    for n in names:
        if not mine(n):
            continue
        path = os.path.join(parent, n)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        yield path if stat.S_ISDIR(st.st_mode) and st.st_uid == me else ""


def retire(prefix: str, names: Iterable[str]) -> dict[str, int]:
    """Rename the extraction directories ``names`` (from :func:`beside`) beside
    ``prefix`` into holders, for :func:`sweep`; run with the job user's rights, while the
    caller holds the node's lock of the prefix (:func:`bootseer.deps.nodecache.prefix_lock`):
    then none of them is a restore still being written, only what a killed one left.

    A rename, not a delete: the lock is what the node's next restore of the prefix waits
    for. Returns ``{"retired": renamed, "left": another user's, or not a directory}``."""
    parent, name = os.path.split(prefix.rstrip("/"))
    mark = extraction_mark(name)
    retired = left = 0
    for path in _own_dirs(parent, names, lambda n: is_named(n, mark)):
        if not path:
            left += 1
            continue
        try:
            set_aside(prefix, path)
        except FileNotFoundError:
            continue  # gone meanwhile
        retired += 1
    return {"retired": retired, "left": left}


def sweep(prefix: str, names: Iterable[str] | None = None) -> dict[str, int]:
    """Remove the holders beside ``prefix`` that belong to this process's user: ``names``
    (from :func:`holders`), or all of them. Run with the job user's rights.

    Returns ``{"removed": holders gone, "left": holders still there}``: one another user
    owns, or that could not be removed whole (a file the user may not delete; the next
    sweep tries again)."""
    parent, name = os.path.split(prefix.rstrip("/"))
    mark = holder_mark(name)
    removed = left = 0
    listed = holders(prefix) if names is None else names
    for path in _own_dirs(parent, listed, lambda n: is_named(n, mark)):
        if not path:
            left += 1
            continue
        # rmtree walks by file descriptors (no symlink followed); with the user's rights
        # it can delete nothing she could not delete herself.
        shutil.rmtree(path, ignore_errors=True)
        if os.path.lexists(path):
            left += 1
        else:
            removed += 1
    return {"removed": removed, "left": left}
