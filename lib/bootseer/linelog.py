"""One stamped line per event, appended to a node-local log file.

The hooks, the node agent and the ckpt FUSE daemon all log this way::

    2026-11-21T10:02:03.123 n1 job=42 prolog step=image outcome=ok secs=0.012 image ready
    2026-11-21T10:02:03.125 agent[4242] job=42 prepared pytorch:24.05 (ab12..., ...)

Many processes append to one file at once (a hook per job on the node); each line is
one ``write`` on an ``O_APPEND`` descriptor, so lines never interleave. Cheap to
import: the hooks load it on every job.

    >>> import tempfile
    >>> log = LineLog(Path(tempfile.mkdtemp()) / "n1-agent.log", "agent[4242]")
    >>> log("agent up")
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from bootseer.errors import describe

# Root's and its group's: the lines name every user's jobs, image paths, checkpoint
# files and why steps failed, which other users may not see (a job's user reads her
# own in `bootseer report` and her mount's .bootseer.log).
LOG_MODE = 0o640


def stamp(now: float | None = None) -> str:
    """Local time to the millisecond, as every bootseer log line starts."""
    now = time.time() if now is None else now
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"


class LineLog:
    """``log(message)`` appends ``<stamp> <prefix> <message>`` to ``path``.

    With ``path`` None, or when the file cannot be opened (no log is no reason to
    fail a job), lines go to stderr, where slurmd or systemd may keep them.

    With ``max_bytes``, a file that has grown past it is renamed ``<path>.1`` (the one
    before that goes) and a new one begun: one process's log (the node agent's) then
    holds at most about twice that on the node, whatever is logged.
    """

    def __init__(self, path: Path | None, prefix: str, max_bytes: int = 0) -> None:
        self.path = path
        self.prefix = prefix
        self.max_bytes = max_bytes
        self._fd: int | None = None
        self._lock = threading.Lock()  # a rotation closes the descriptor others write on
        if path is None:
            return
        self._open()

    def _open(self) -> None:
        assert self.path is not None
        path = self.path
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
            self._fd = os.open(path, flags, LOG_MODE)
            st = os.fstat(self._fd)
            if st.st_uid == os.geteuid() and st.st_mode & 0o007:
                os.fchmod(self._fd, st.st_mode & 0o770)  # a log from before LOG_MODE
        except OSError as exc:
            print(f"bootseer: cannot open {path}: {describe(exc)}", file=sys.stderr)

    def __call__(self, message: str) -> None:
        line = f"{stamp()} {self.prefix} {message}\n".encode(errors="replace")
        if self._fd is None:
            sys.stderr.buffer.write(line)
            sys.stderr.flush()
            return
        if not self.max_bytes:
            os.write(self._fd, line)
            return
        with self._lock:
            if self._fd is None:
                return
            os.write(self._fd, line)
            if os.fstat(self._fd).st_size > self.max_bytes:
                self._rotate()

    def _rotate(self) -> None:
        assert self.path is not None and self._fd is not None
        try:
            os.rename(self.path, self.path.with_name(self.path.name + ".1"))
        except OSError as exc:
            print(f"bootseer: cannot rotate {self.path}: {describe(exc)}", file=sys.stderr)
            return
        os.close(self._fd)
        self._fd = None
        self._open()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
