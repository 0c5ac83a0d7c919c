"""What root runs or reads from an install must be writable by root alone, all the way up.

The prolog, epilog and agent (root) run the venv's interpreter, which is the node's own
Python (``--python``), and read the config, secrets and site key in ``--etc``. A
directory on the way to any of them that another user can write, or owns, lets that
user rename root's entry away and put her own in its place: her program then runs as
root on the next job. ``mkdir -p`` keeps a directory that is already there, so a user
who made ``/var/tmp/x`` before the install got the install inside her own directory.

Every component of those paths, as given and as resolved, that exists must be root's
and not writable by group (other than root's) or others; a sticky directory (``/tmp``,
``/var/tmp``) may be, since no user can rename root's entries in it. Symbolic links
count by their owner only. Checked before anything is written and again once the
directories are made (a user racing ``mkdir -p`` with a directory of her own is caught
there), by :func:`check_node`::

    >>> check_node(node, "/usr/bin/python3", [Path("/opt/bootseer")])  # doctest: +SKIP
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from bootseer.install.remote import Node, RemoteError

# Run by the node's Python (stdlib only): its own executable and standard library count
# too. Answers {path: why} for each component that is not root's alone.
PROBE = r"""
import json, os, stat, sys
req = json.load(sys.stdin)
paths = req["paths"] + [sys.executable, os.path.dirname(os.__file__)]
def chain(p):
    p = os.path.abspath(p)
    out = [p]
    while os.path.dirname(p) != p:
        p = os.path.dirname(p)
        out.append(p)
    return out
seen = {}
for p in paths:
    for q in chain(p) + chain(os.path.realpath(p)):
        if q in seen:
            continue
        try:
            st = os.lstat(q)
        except OSError:
            seen[q] = None
            continue
        mode = stat.S_IMODE(st.st_mode)
        why = None
        if st.st_uid != 0:
            why = "owned by uid %d" % st.st_uid
        elif stat.S_ISLNK(st.st_mode) or (stat.S_ISDIR(st.st_mode) and mode & stat.S_ISVTX):
            pass
        elif mode & 0o002:
            why = "writable by every user (mode %04o)" % mode
        elif mode & 0o020 and st.st_gid != 0:
            why = "writable by group %d (mode %04o)" % (st.st_gid, mode)
        seen[q] = why
print(json.dumps({q: w for q, w in seen.items() if w}))
"""


class UntrustedPath(RemoteError):
    """A path root would run or read from is not root's alone; nothing was written."""


def untrusted(node: Node, python: str, paths: Iterable[Path]) -> dict[str, str]:
    """``{path: why}`` for each component of ``paths`` and of ``python`` (and its
    standard library) on ``node`` that a user other than root could change."""
    req = json.dumps({"paths": [str(p) for p in paths]}).encode()
    r = node.run([python, "-c", PROBE], req, timeout=120)
    if r.status != 0:
        raise RemoteError(f"checking who may write the install's paths failed: {r.err[-500:]}")
    found: dict[str, str] = json.loads(r.out)
    return found


def check_node(node: Node, python: str, paths: Iterable[Path]) -> None:
    """:class:`UntrustedPath` naming each such component, else nothing."""
    found = untrusted(node, python, paths)
    if found:
        shown = "; ".join(f"{p} is {why}" for p, why in sorted(found.items())[:5])
        more = f" (+{len(found) - 5} more)" if len(found) > 5 else ""
        raise UntrustedPath(
            f"{shown}{more}: root would run or read what its writer puts there. Make each "
            "root's and not writable by others (chown root:root, chmod go-w), or install "
            "elsewhere (--prefix, --etc, --python)"
        )
