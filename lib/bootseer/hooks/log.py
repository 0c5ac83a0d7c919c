"""The per-node hook log: ``<log_dir>/<node>.log``, one line per event, tagged with the job.

Lines look like::

    2026-11-21T10:02:03.123 n1 job=42 prolog step=image outcome=ok secs=0.012 image ready

(:mod:`bootseer.linelog` writes them: one ``write`` per line, so lines never interleave.)
"""

from __future__ import annotations

from pathlib import Path

from bootseer.linelog import LineLog
from bootseer.nodepaths import hook_log


class HookLog(LineLog):
    def __init__(self, log_dir: Path, node: str, job_id: int | str, hook: str) -> None:
        super().__init__(hook_log(log_dir, node), f"{node} job={job_id} {hook}")
