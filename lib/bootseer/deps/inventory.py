"""What is under a prefix, and what an install added or changed there.

``bootseer deps run`` takes an inventory before and right after the install; the
snapshot holds only the difference, so whatever the job writes to the prefix later
(logs, caches) is never captured.

    >>> changed({"a": ("f", 1, 0, 0o644)}, {"a": ("f", 2, 1, 0o644), "b": ("d", 0, 0, 0o755)})
    ['a', 'b']
"""

from __future__ import annotations

import os
import stat

Inventory = dict[str, tuple[str, int, int, int]]  # name -> (kind, size, mtime_ns, mode)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "d"
    if stat.S_ISLNK(mode):
        return "l"
    if stat.S_ISREG(mode):
        return "f"
    return "o"


def inventory(prefix: str) -> Inventory:
    """Every entry under ``prefix`` (not following links); empty if it does not exist."""
    out: Inventory = {}
    if not os.path.isdir(prefix) or os.path.islink(prefix):
        return out
    for top, dirs, files in os.walk(prefix):
        rel = os.path.relpath(top, prefix)
        base = "" if rel == "." else rel + "/"
        for name in dirs + files:
            try:
                st = os.lstat(os.path.join(top, name))
            except FileNotFoundError:
                continue
            out[base + name] = (
                _kind(st.st_mode),
                st.st_size,
                st.st_mtime_ns,
                stat.S_IMODE(st.st_mode),
            )
    return out


def changed(before: Inventory, after: Inventory) -> list[str]:
    """Names in ``after`` that are new or differ from ``before``, parents first."""
    return sorted(n for n, v in after.items() if before.get(n) != v)
