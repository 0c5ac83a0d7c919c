"""Start a detached flush: its own session, /dev/null for output, nobody waits for it.

``os.posix_spawn`` rather than ``subprocess``: importing subprocess alone costs the
prolog ~15 ms, and slurmd waits for the prolog's output to close, so the child must
hold none of it (Python's own descriptors are not inherited, PEP 446).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing costs a mark from a job script milliseconds
if TYPE_CHECKING:
    from typing import Literal


def spawn_flush(
    mode: Literal["prolog", "marks"], spool_dir: str, first_node: bool = False
) -> int | None:
    """``python -m bootseer.phases.flush --MODE [--first-node] SPOOL_DIR`` in the
    background; its pid."""
    devnull = os.devnull
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, devnull, os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, devnull, os.O_WRONLY, 0),
    ]
    argv = [sys.executable, "-m", "bootseer.phases.flush", f"--{mode}"]
    argv += ["--first-node", spool_dir] if first_node else [spool_dir]
    try:
        return os.posix_spawn(
            sys.executable, argv, dict(os.environ), file_actions=actions, setsid=True
        )
    except OSError:
        return None
