"""What a checkpoint mount moved, from its daemon to the epilog: one typed document.

The daemon (root) writes it once, when it leaves, beside its log, atomically (a
temporary file renamed over), mode 0600; the epilog reads it for the job's ``ckpt``
phase row. The epilog used to pick these counts out of the log's lines, which also hold
what the job did (file names, errors): a contract, not a log format, is what crosses.
A daemon that was killed leaves no totals: the epilog records zeros and says
that the daemon died.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> MountTotals(read_bytes=5, committed=1).write(totals_path(d / "fuse.log"))
>>> MountTotals.read(d / "fuse.log.totals.json")
MountTotals(read_bytes=5, written_bytes=0, committed=1, dropped=0, store_bytes=0, peer_bytes=0)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bootseer import localrecord
from bootseer.jsondecode import Whole

MAX_BYTES = 4096


def totals_path(log_path: str | Path) -> Path:
    """Where the daemon whose log is ``log_path`` leaves its totals."""
    log_path = Path(log_path)
    return log_path.with_name(log_path.name + ".totals.json")


@dataclass(frozen=True)
class MountTotals:
    read_bytes: Whole = 0  # served to the job through the mount
    written_bytes: Whole = 0  # written by the job into the mount
    committed: Whole = 0  # new versions committed
    dropped: Whole = 0  # new versions dropped (a writer killed, a write failed, open at unmount)
    store_bytes: Whole = 0  # units this node read from the targets
    peer_bytes: Whole = 0  # units this node had from the job's other nodes

    def write(self, path: Path) -> None:
        localrecord.write(path, self)

    @classmethod
    def read(cls, path: Path) -> MountTotals | None:
        """The totals at ``path``, or None when there are none (or none that parse)."""
        try:
            return localrecord.read(cls, path, MAX_BYTES)
        except (OSError, localrecord.RecordError):
            return None
