"""Small node-local records: a dataclass as a JSON file, under one safety policy.

Root writes records into directories of its own (a job's dir, the agent's state, the
phase spool) and reads them back, sometimes in another process or after an upgrade.
Every record is written and read the same way:

- **whole or not at all**: a new file made by ``mkstemp`` in the record's directory
  (``O_EXCL``, a name nobody can guess, so never through a link planted at a known temp
  name), its mode set, written, and renamed over the record;
- **never through a link** on reading either (``O_NOFOLLOW``), a regular file only
  (``O_NONBLOCK``: a FIFO planted at the path cannot hang root), at most ``max_bytes``;
- **decoded into its type** (:mod:`bootseer.jsondecode`): a missing or mistyped field is a
  :class:`RecordError` naming the file and the field, never a ``KeyError`` later.

    >>> import tempfile
    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class Stamp:
    ...     prefix: str
    ...     key: str
    >>> d = Path(tempfile.mkdtemp())
    >>> write(d / "s.json", Stamp("/tmp/venv", "ab12"))
    >>> read(Stamp, d / "s.json")
    Stamp(prefix='/tmp/venv', key='ab12')
    >>> read(Stamp, d / "none.json") is None
    True
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from bootseer import jsonlimits
from bootseer.errors import BootseerError
from bootseer.jsondecode import DecodeError, decode

MAX_BYTES = 64 << 10  # a record larger than this is refused unread

T = TypeVar("T")


class RecordError(BootseerError):
    """A record that is not one: too large, not JSON, a field missing or mistyped, or not
    a regular file (the message names the file and what is wrong)."""


def write_bytes(path: Path, data: bytes, mode: int = 0o600, sync: bool = False) -> None:
    """``data`` as the file ``path``, whole or not at all (the policy above); ``sync``:
    on disk before the rename, for a record that must survive a crash of the node."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with open(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)  # whatever the umask
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_bytes(path: Path, max_bytes: int = MAX_BYTES) -> bytes | None:
    """The file at ``path``, or None if there is none; :class:`RecordError` for a link, a
    FIFO or anything but a regular file, or one larger than ``max_bytes``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a link at the record's path
        raise RecordError(f"{path}: not read: {exc.strerror}") from None
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise RecordError(f"{path}: not a regular file")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise RecordError(f"{path}: larger than {max_bytes} bytes")
    return data


def write(path: Path, record: Any, mode: int = 0o600, sync: bool = False) -> None:
    """The dataclass ``record`` as JSON at ``path`` (:func:`write_bytes`)."""
    write_bytes(path, json.dumps(asdict(record)).encode(), mode, sync)


def read(cls: type[T], path: Path, max_bytes: int = MAX_BYTES) -> T | None:
    """The record of type ``cls`` at ``path``, or None if there is none;
    :class:`RecordError` if what is there is not one."""
    data = read_bytes(path, max_bytes)
    if data is None:
        return None
    try:
        doc = jsonlimits.loads(data, max_bytes=max_bytes, what=str(path))
        out: T = decode(cls, doc, path.name)
    except DecodeError as exc:
        raise RecordError(f"{path}: {exc}") from None
    except ValueError as exc:  # not JSON, or past jsonlimits' depth
        raise RecordError(f"{path}: {exc}") from None
    return out
