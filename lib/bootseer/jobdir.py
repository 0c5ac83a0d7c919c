"""A job's state on one node: ``<run_dir>/jobs/<job_id>/`` (:mod:`bootseer.nodepaths`).

- ``env``: ``NAME=VALUE`` lines the SPANK plugin puts into the job's tasks
  (``BOOTSEER_IMAGE``, ``BOOTSEER_CKPT``, ...: names of
  :data:`bootseer.nodepaths.ENV_NAMES` only, each of which the plugin unsets where the
  node's file does not set it). Written whole by the prolog or not at all,
  root's alone (0600): it names the job's image, checkpoint and prefix, which are no other
  user's business; the plugin reads it in slurmstepd before it drops to the job's user.
  Its first line, ``#bootseer-env 2``, names the contract it is written under
  (:data:`bootseer.nodepaths.ENV_CONTRACT`): a plugin of another one says so in the job's
  stderr and the slurmd log rather than setting nothing in silence.
- whatever a step keeps between prolog and epilog, in a sub-directory named for it
  (root's alone, 0700, unless the step lets its job's user through to a directory of
  hers: the deps step's ``job/``).

The directory belongs to root, mode 0711: users may pass through it (to their own
``deps/job/``) but not list it, and nothing in it is readable by other users. The SPANK
plugin refuses an ``env`` file that is not root's or that others may write.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
from pathlib import Path

from bootseer import localrecord, nodepaths
from bootseer.errors import StepError

_ENV_NAME = re.compile(r"^BOOTSEER_[A-Z0-9_]+$")


class JobDir:
    def __init__(self, run_dir: Path, job_id: int) -> None:
        self.path = nodepaths.job_dir(run_dir, job_id)

    def create(self) -> JobDir:
        """The job's directory, root's, in ``<run_dir>/jobs``, which only root may write:
        whatever the umask made of that (a first prolog's ``mkdir -p`` under umask 0 made
        it 0777), no user makes or links a job's directory before its prolog.
        :class:`StepError` (the job starts the ordinary way) for a directory, or a link,
        someone else made: root writes nothing into it and changes nothing it leads to."""
        jobs = self.path.parent
        nodepaths.root_only_dir(jobs.parent, sticky_ok=True, follow=True)
        nodepaths.root_only_dir(jobs)
        with contextlib.suppress(FileExistsError):  # this job's, from a prolog before
            self.path.mkdir(mode=0o711)  # (requeued): checked below
        st = os.lstat(self.path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise StepError(
                f"job dir {self.path} exists and is not root's (a link, or another "
                "user's): refused, the job starts without bootseer"
            )
        self.path.chmod(0o711)  # whatever the umask, or an earlier version, made it
        return self

    def sub(self, name: str, mode: int = 0o700) -> Path:
        """The step's directory: root's alone (0700), or ``mode`` (0711 to let the job's
        user through to a directory of hers inside)."""
        p = self.path / name
        try:
            p.mkdir(mode=mode)
        except FileExistsError:
            return p  # the step's own, made earlier in this job
        p.chmod(mode)  # whatever the umask
        return p

    def write_env(self, env: dict[str, str]) -> None:
        lines = [f"{nodepaths.ENV_HEADER} {nodepaths.ENV_CONTRACT}\n"]
        for name, value in sorted(env.items()):
            if not _ENV_NAME.fullmatch(name) or "\n" in value or "\0" in value:
                raise ValueError(f"refusing to export {name}={value!r} to the job")
            if name not in nodepaths.ENV_NAMES:  # the plugin would not unset it elsewhere
                raise ValueError(f"{name} is not in nodepaths.ENV_NAMES (nor the plugin's)")
            lines.append(f"{name}={value}\n")
        self._write_atomic(nodepaths.JOB_ENV, "".join(lines), mode=0o600)

    def read_env(self) -> dict[str, str]:
        try:
            text = (self.path / nodepaths.JOB_ENV).read_text()
        except FileNotFoundError:
            return {}
        return dict(
            line.split("=", 1)
            for line in text.splitlines()
            if "=" in line and not line.startswith("#")
        )

    def remove(self) -> None:
        """The job dir, and first what is mounted in it (the deps step's tmpfs for the
        user's ``deps/job/``), lazily: a task may still hold a file there."""
        from bootseer import mounts

        for mp in mounts.mounts_under(self.path):
            with contextlib.suppress(OSError):
                mounts.umount(mp, lazy=True)
        shutil.rmtree(self.path, ignore_errors=True)

    def _write_atomic(self, name: str, text: str, mode: int) -> None:
        localrecord.write_bytes(self.path / name, text.encode(), mode)
