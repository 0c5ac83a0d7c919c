"""User names as bootseer keeps things under them (traces, checkpoint namespaces).

Slurm hands over any name its user database holds; bootseer uses one as a store key or
a file name, so it takes only the portable POSIX set, as useradd's default does::

    >>> check_user("ada"), is_user_name("../root"), is_user_name("ada\\n")
    ('ada', False, False)
"""

from __future__ import annotations

import re

# A letter, digit or "_" first (never "." or "-": no ".." and no option), up to 64.
USER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")


def is_user_name(name: str) -> bool:
    return USER_NAME.fullmatch(name) is not None


def check_user(name: str) -> str:
    """``name`` if a user's traces may be kept under it, else ValueError."""
    if not is_user_name(name):
        raise ValueError(f"{name!r} is not a user name a trace can be kept under")
    return name
