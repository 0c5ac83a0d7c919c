"""The checkpoint mount daemon's log: its log file, capped, and its last lines for the job.

The daemon's stderr is its log file (:mod:`bootseer.ckpt.mount` opens it, root's). Many
of its lines answer a call of the job's user (a refused name, a second writer, an
append): the file takes at most :data:`LOG_FILE_BYTES` of them, and the last lines are
also the read-only file :data:`LOG_NAME` at the mount's root, so the job's user can
read why a call failed (:mod:`bootseer.ckptd.fs`).
"""

from __future__ import annotations

import collections
import os
import threading

from bootseer.linelog import LineLog, stamp

# The job's view of the daemon's log: a read-only file at the mount's root.
LOG_NAME = ".bootseer.log"


# What one mount's log file (``[paths] log_dir``/ckpt/<job>.log) may hold. Many of its
# lines answer a call of the job's user (a refused name, a second writer, an append):
# without a cap, a loop of such calls filled the node's log disk.
LOG_FILE_BYTES = 4 << 20


class DaemonLog:
    """The daemon's stderr is its log file (bootseer.ckpt.mount opens it, root's); the
    last lines are also kept for :data:`LOG_NAME`, so the job's user can read why a call
    failed. The file takes at most ``max_bytes`` of lines (then a note, and at exit how
    many were left out, with the daemon's last lines: ``last=True``)."""

    def __init__(self, keep: int = 1000, max_bytes: int = LOG_FILE_BYTES) -> None:
        self.line = LineLog(None, f"ckpt-fuse[{os.getpid()}]")
        self.recent: collections.deque[str] = collections.deque(maxlen=keep)
        self.max_bytes = max_bytes
        self.written = 0
        self.dropped = 0
        self._lock = threading.Lock()

    def __call__(self, message: str, last: bool = False) -> None:
        text = f"{stamp()} {message}\n"
        self.recent.append(text)
        size = len(text) + len(self.line.prefix) + 1
        with self._lock:
            if last and self.dropped:
                self.line(f"{self.dropped} lines left out of this file past its cap")
                self.dropped = 0
            elif not last and self.written + size > self.max_bytes:
                if not self.dropped:
                    self.line(
                        f"this log file is at its cap of {self.max_bytes} bytes: further "
                        f"lines go only to the mount's {LOG_NAME} (its last "
                        f"{self.recent.maxlen}) until the daemon's last lines"
                    )
                self.dropped += 1
                return
            self.written += size
            self.line(message)

    def text(self) -> bytes:
        return "".join(self.recent).encode(errors="replace")


# The daemon process's: it serves one mount.
log = DaemonLog()
