"""What one checkpoint mount has done so far: the filesystem's counters, read at once.

:meth:`bootseer.ckptd.fs.CkptFS.counts` takes them; the daemon's metrics
(:mod:`bootseer.ckptd.metrics`) add them to the node's file while it serves, and at exit
the daemon leaves their :class:`~bootseer.ckpt.totals.MountTotals` for the epilog.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, get_args

from bootseer.ckpt.totals import MountTotals

# Why a mount refuses a call (the metrics label's whole set): a name it does not take,
# an operation on its log file or a link (EPERM/EACCES), an append to a file (striped
# files are written whole), the user's quota (EDQUOT), node-local staging full (ENOSPC).
Refusal = Literal["name", "not_permitted", "append", "quota", "stage_full"]
REFUSALS: tuple[Refusal, ...] = get_args(Refusal)


@dataclass(frozen=True)
class MountCounts:
    bytes_read: int  # served to the job
    bytes_written: int  # written by the job
    reads: int  # read requests of the job's
    committed: int  # new versions committed (closed or fsynced whole)
    dropped: int  # new versions dropped (the writer died, a write failed, open at unmount)
    io_errors: int  # calls answered EIO
    refused: Mapping[Refusal, int]  # calls refused, by reason
    store_bytes: int  # unit bytes read from the targets
    peer_bytes: int  # unit bytes read from the job's other nodes
    corrupt_units: int  # units refused: their checksum is not the manifest's
    manifests_refused: int  # manifests whose MAC does not verify under the site key
    staged_bytes: int  # bytes written out of order into node-local staging

    def totals(self) -> MountTotals:
        """What the epilog records of the mount (its phase row's bytes)."""
        return MountTotals(
            self.bytes_read,
            self.bytes_written,
            self.committed,
            self.dropped,
            self.store_bytes,
            self.peer_bytes,
        )
