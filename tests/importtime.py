"""What a process imported, from ``python -X importtime`` (or ``PYTHONPROFILEIMPORTTIME=1``):
the lines it writes on stderr, ``import time: self | cumulative | name``."""

from __future__ import annotations


def imported(stderr: str) -> set[str]:
    """The modules named in an importtime listing (``stderr`` may hold other lines too)."""
    return {
        line.rsplit("|", 1)[1].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    } - {"package"}  # the header line's last column
