"""The per-node hook log: ``<log_dir>/<node>.log``, one line per event, tagged with the job.

Lines look like::

    2026-11-21T10:02:03.123 n1 job=42 prolog step=image outcome=ok secs=0.012 image ready

Many hooks append at once (one per job on the node); each line is one ``write`` on
an ``O_APPEND`` descriptor, so lines never interleave.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


class HookLog:
    def __init__(self, log_dir: Path, node: str, job_id: int | str, hook: str) -> None:
        self.prefix = f"{node} job={job_id} {hook}"
        self.path = log_dir / f"{node}.log"
        self._fd: int | None = None
        try:
            log_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            # No log is no reason to fail a job: say so where slurmd may keep it.
            print(f"bootseer: cannot open {self.path}: {exc}", file=sys.stderr)

    def __call__(self, message: str) -> None:
        now = time.time()
        stamp = (
            time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
        )
        line = f"{stamp} {self.prefix} {message}\n".encode(errors="replace")
        if self._fd is None:
            sys.stderr.buffer.write(line)
            return
        os.write(self._fd, line)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
