"""Who runs a command: the user name of the real uid (never ``$USER``/``$LOGNAME``, which
are the caller's to set), and the refusal of an admin action to anyone but root.

    >>> user_name() == pwd.getpwuid(os.getuid()).pw_name
    True
"""

from __future__ import annotations

import os
import pwd

from bootseer.errors import BootseerError


def user_name() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def require_root(action: str, why: str) -> None:
    """Refuse ``action`` in one line unless root runs it (users hold no store credentials)."""
    if os.geteuid() != 0:
        raise BootseerError(f"{action} is an admin action ({why}): run it as root")
