"""What the benches measure on the host itself, with the standard library alone (so a
bench's job on a node, run as its user, imports it as well as the bench does): a file's
pages out of the page cache, and a live process's CPU."""

from __future__ import annotations

import os
from pathlib import Path


def drop_pages(path: Path) -> None:
    """``path``'s clean pages out of the page cache (this file only): its next read is
    a cold one."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a live process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
