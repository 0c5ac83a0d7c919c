"""What the agent keeps on disk about each prepared job, so a restart loses no job.

A job's lazy image file must keep working when the agent restarts (an upgrade, a
crash) while the job runs: the prolog's answer named that file and the job holds it.
So ``prepare`` writes one small JSON file per job, ``release`` removes it, and a
starting agent reads them all back (:meth:`bootseer.agent.jobs.Jobs.restore`). The
trace recorded before the restart is lost; the file is not. A path image's file is
opened again as the job's user and must be the very file opened before (device,
inode, size, mtime), or the job's view is dropped.

    >>> import tempfile
    >>> state = RestartState(Path(tempfile.mkdtemp()) / "jobs", print)
    >>> state.save(SavedJob(42, 1000, 1000, "pytorch:24.05", "ab12...", False, None))
    >>> [job.job_id for job in state.load()]
    [42]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bootseer import localrecord
from bootseer.errors import describe


@dataclass(frozen=True)
class SavedJob:
    job_id: int
    uid: int
    gid: int
    ref: str  # what the job asked for
    image: str  # the manifest id
    refresh: bool
    path: str | None  # the image file a path image's blocks are read from; None: the store
    # The file the agent opened (device, inode, size, mtime in ns): after a restart the
    # path is opened again, as the job's user, and must still be this very file.
    file: tuple[int, int, int, int] | None = None


class RestartState:
    """One ``<job_id>.json`` per prepared job in ``directory`` (root's alone)."""

    def __init__(self, directory: Path, log: Callable[[str], None]) -> None:
        self.dir = directory
        self.log = log
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    def _file(self, job_id: int) -> Path:
        return self.dir / f"{job_id}.json"

    def save(self, job: SavedJob) -> None:
        localrecord.write(self._file(job.job_id), job)

    def forget(self, job_id: int, why: str = "") -> None:
        if why:
            self.log(f"state {job_id}.json not restored: {why}")
        self._file(job_id).unlink(missing_ok=True)

    def load(self) -> Iterator[SavedJob]:
        """Every saved job; a damaged file is logged and removed."""
        for f in sorted(self.dir.glob("*.json")):
            try:
                saved = localrecord.read(SavedJob, f)
            except (OSError, localrecord.RecordError) as exc:
                self.log(f"state {f.name} not restored: {describe(exc)}")
                f.unlink(missing_ok=True)
                continue
            if saved is not None:
                yield dataclasses.replace(saved, path=saved.path or None)
