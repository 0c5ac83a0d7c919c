"""What striped checkpoint storage raises: one tree, under :class:`CkptError`.

A file object's callers (``torch.load``, the FUSE mount) see the errors of a read or a
write as :class:`OSError` with the errno a filesystem would give: EIO for a damaged
unit, EDQUOT past a quota, ENOSPC when node-local staging is full::

    >>> err = CkptQuotaExceeded("ada/run:model.pt: 1 GiB more would pass ada's quota")
    >>> isinstance(err, OSError), err.errno == errno.EDQUOT, str(err)[:16]
    (True, True, 'ada/run:model.pt')
"""

from __future__ import annotations

import errno
from typing import ClassVar

from bootseer.errors import BootseerError, QuotaExceeded


class CkptError(BootseerError):
    """Striped checkpoint storage failed; the message names the file and what to check."""


class CkptPathError(CkptError, ValueError):
    """A file or namespace name would leave its namespace or is not a valid key."""


class CkptLinkAbsolute(CkptPathError):
    """A symlink's target is absolute: it would name a path outside the namespace (EPERM)."""


class CkptLinkEscapes(CkptPathError):
    """A symlink's target climbs out of the namespace with ``..`` (EXDEV)."""


class _CkptOSError(CkptError, OSError):
    """A checkpoint error that file-object callers see as ``OSError(ERRNO)``; its text
    is the message alone (no ``[Errno N]`` prefix)."""

    ERRNO: ClassVar[int]

    def __init__(self, message: str) -> None:
        super().__init__(self.ERRNO, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class CkptIOError(_CkptOSError):
    """A unit could not be read or is damaged: an I/O error to file-object callers."""

    ERRNO = errno.EIO


class CkptQuotaExceeded(QuotaExceeded, _CkptOSError):
    """A write would take a scope past its ``ckpt.quota``: ``EDQUOT`` to file-object
    callers; the message says who holds how much and what frees room."""

    ERRNO = errno.EDQUOT


class StageFullError(_CkptOSError):
    """Out-of-order writes need more node-local staging than ``[ckpt] stage_bytes``: ENOSPC."""

    ERRNO = errno.ENOSPC


class LedgerFull(CkptError):
    """The node's staged bytes would pass the bound; the message says how many are in use."""

    def __init__(self, used: int, limit: int) -> None:
        super().__init__(f"{used} of {limit} bytes staged on this node")
        self.used = used
        self.limit = limit
