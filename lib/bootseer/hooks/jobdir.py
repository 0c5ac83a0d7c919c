"""A job's state on one node: ``<run_dir>/jobs/<job_id>/`` (:mod:`bootseer.nodepaths`).

- ``env``: ``NAME=VALUE`` lines the SPANK plugin puts into the job's tasks
  (``BOOTSEER_IMAGE``, ``BOOTSEER_CKPT``, ...). Written whole by the prolog or not at all.
- whatever a step keeps between prolog and epilog, in a sub-directory named for it.

The directory belongs to root; the SPANK plugin refuses an ``env`` file that is not
root's or that others may write.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from bootseer import nodepaths

_ENV_NAME = re.compile(r"^BOOTSEER_[A-Z0-9_]+$")


class JobDir:
    def __init__(self, run_dir: Path, job_id: int) -> None:
        self.path = nodepaths.job_dir(run_dir, job_id)

    def create(self) -> JobDir:
        self.path.mkdir(parents=True, exist_ok=True, mode=0o755)
        return self

    def sub(self, name: str) -> Path:
        p = self.path / name
        p.mkdir(parents=True, exist_ok=True, mode=0o755)
        return p

    def write_env(self, env: dict[str, str]) -> None:
        lines = []
        for name, value in sorted(env.items()):
            if not _ENV_NAME.fullmatch(name) or "\n" in value or "\0" in value:
                raise ValueError(f"refusing to export {name}={value!r} to the job")
            lines.append(f"{name}={value}\n")
        self._write_atomic(nodepaths.JOB_ENV, "".join(lines))

    def read_env(self) -> dict[str, str]:
        try:
            text = (self.path / nodepaths.JOB_ENV).read_text()
        except FileNotFoundError:
            return {}
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def _write_atomic(self, name: str, text: str) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=f".{name}.")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
