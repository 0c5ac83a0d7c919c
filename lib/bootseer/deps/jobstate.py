"""What the prolog, the job's ``bootseer deps run`` and the epilog tell each other.

In the per-node job directory (``<run_dir>/jobs/<id>/deps/``):

- ``prolog.json`` (root's, 0600): the base key, scope, prefix, the job's uid and the
  snapshot key the prolog restored, if any. Written before the restore starts, so the
  epilog knows the base even when the restore failed. The epilog trusts only this copy.
- ``job/prolog.json``: the same, for the job's ``bootseer deps run`` (in its user's
  directory, so no other user reads her prefix and scope; she may change her copy, which
  misleads only her own ``deps run``).
- ``job/`` (the job user's, 0700): ``bootseer deps run`` writes ``install.json`` there
  after an install (the command and the names it added or changed) for the epilog's
  capture. Root never opens anything in it: the capture child reads it with the
  user's rights. The record holds the install's exit ``status``; only 0 is captured,
  and a new install removes the old record first, so an install that fails (or dies
  before it records) leaves nothing for the epilog to capture.

    >>> job_dir(Path("/run/bootseer"), 42)
    PosixPath('/run/bootseer/jobs/42/deps')

(:mod:`bootseer.nodepaths` names both.)
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bootseer import jsonlimits, localrecord, nodepaths

MAX_RECORD = 256 << 20


def job_dir(run_dir: Path, job_id: int) -> Path:
    return nodepaths.step_dir(run_dir, job_id, "deps")


@dataclass
class PrologState:
    base: str
    scope: str
    prefix: str
    restored: str | None = None
    uid: int | None = None  # the job's user (bootseer.deps.prefixuse); None: an older state

    @classmethod
    def read(cls, path: Path) -> PrologState | None:
        try:
            return localrecord.read(cls, path, MAX_RECORD)
        except (OSError, localrecord.RecordError):
            return None

    def write(self, path: Path, mode: int = 0o600) -> None:
        """Whole or not at all, root's. A new file by ``mkstemp`` and a rename: ``path``
        may lie in the job user's directory, where a name she planted (a link) is replaced,
        never written through."""
        localrecord.write(path, self, mode)


def read_install_record(path: str) -> dict[str, Any] | None:
    """The job's install record, read with the rights of the caller (the job's user)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_RECORD + 1)
    if len(data) > MAX_RECORD:
        raise ValueError(f"{path} is larger than {MAX_RECORD} bytes")
    rec = jsonlimits.loads(data, max_bytes=MAX_RECORD, what=path)
    if not isinstance(rec, dict):
        raise ValueError(f"{path} is not a JSON object")
    cmd = rec.get("command")
    names = rec.get("names")
    if cmd is not None and not (isinstance(cmd, list) and all(isinstance(a, str) for a in cmd)):
        raise ValueError(f"{path}: command must be a list of strings")
    if names is not None and not (
        isinstance(names, list) and all(isinstance(n, str) for n in names)
    ):
        raise ValueError(f"{path}: names must be a list of strings")
    status = rec.get("status")
    if not isinstance(status, int) or isinstance(status, bool):
        status = None  # unknown: never captured
    return {
        "command": cmd,
        "names": names,
        "prefix": str(rec.get("prefix", "")),
        "fresh": rec.get("fresh") is not False,
        "status": status,
    }


def clear_install_record(path: str) -> None:
    """Before an install: whatever an earlier one recorded no longer describes the prefix."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def write_install_record(path: str, record: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)
