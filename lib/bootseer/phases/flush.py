"""Flush a node's phase spool to the store: one Parquet file per flush.

Three flushes, one module:

- ``prolog``: the prolog's rows, from a detached root process the prolog starts, so
  the job's start never waits for pyarrow or the store. On the job's first node it
  also asks Slurm for the submit time, name and account (one ``squeue --json``).
- ``marks``: the job's marks so far, from a detached process started by the job
  when ``first_step`` ends (as the job's user: it needs write access to the store;
  without it nothing is lost, the epilog writes the same rows).
- ``epilog``: everything (prolog rows, every mark, the epilog's rows), inline, then
  the spool goes. This is the flush that guarantees no row is lost.

Root's flushes seal each file with the site key (:mod:`bootseer.phases.seal`); what a
user's process writes is unsealed, and root's reports do not count it.

Rows written by more than one flush are merged by the reader, so the early flushes
only make a running job visible sooner: their process runs at nice 19, as the agent's
background fill does, and takes no CPU a busy node's job starts need.

    python -m bootseer.phases.flush --prolog [--first-node] /run/bootseer/phases/4242
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bootseer.errors import describe
from bootseer.phases.schema import HOOK_PHASES, JobMeta, PhaseRow
from bootseer.phases.spool import Spool, rows_from_marks
from bootseer.phases.writer import Flush, write_rows
from bootseer.sitekey import site_keys

if TYPE_CHECKING:
    from bootseer.config import SiteConfig
    from bootseer.sitekey import SiteKeys
    from bootseer.store import Store

# squeue's JSON for every job in the queue: Slurm 22.05 ignores --jobs with --json.
MAX_SQUEUE_JSON = 256 << 20


def slurm_job_info(job_id: int, squeue: Path, timeout: float) -> dict[str, object]:
    """Submit time, name, account, array task and batch script from ``squeue --json``
    (the prolog's environment lacks them); empty if Slurm does not answer. Structured
    output only: the job name is the user's free text, so a line of ``scontrol -o show
    job`` cannot tell a real ``SubmitTime=`` or ``Account=`` from one inside the name."""
    try:
        r = subprocess.run(
            [str(squeue), "--json", "--states=all", f"--jobs={int(job_id)}"],
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if r.returncode != 0 or len(r.stdout) > MAX_SQUEUE_JSON:
        return {}
    try:
        data = json.loads(r.stdout)
    except (ValueError, RecursionError):
        return {}
    jobs = data.get("jobs") if isinstance(data, dict) else None
    job = next(
        (j for j in jobs or [] if isinstance(j, dict) and j.get("job_id") == int(job_id)), None
    )
    if job is None:
        return {}
    info: dict[str, object] = {}
    submit = _number(job.get("submit_time"))
    if submit is not None and submit > 0:
        info["submit_time"] = float(submit)
    array_job, array_task = _number(job.get("array_job_id")), _number(job.get("array_task_id"))
    # Slurm says 0 / NO_VAL (0xfffffffe) for a job that is not an array task.
    if array_job and array_task is not None and 0 <= array_task < 0xFFFFFFFE:
        info["array_job_id"], info["array_task_id"] = array_job, array_task
    command = job.get("command")
    if isinstance(command, str) and command.startswith("/"):  # the batch script's path
        info["script"] = command[:1024]
    elif job.get("batch_flag", True):  # sbatch read the script from standard input
        digest = script_digest(job_id, squeue.with_name("scontrol"), timeout)
        if digest:
            info["script"] = digest
    name = job.get("name")
    if isinstance(name, str):
        info["job_name"] = name[:200]
    account = job.get("account")
    if isinstance(account, str) and account and account != "(null)":
        info["account"] = account[:64]
    return info


MAX_SCRIPT = 64 << 20


def script_digest(job_id: int, scontrol: Path, timeout: float) -> str | None:
    """``sha256:`` and 16 hex digits of the job's batch script as slurmctld holds it
    (``scontrol write batch_script``), for a script Slurm has no path for: runs of the
    same script compare side by side in the report."""
    import hashlib

    try:
        r = subprocess.run(
            [str(scontrol), "write", "batch_script", str(int(job_id)), "-"],
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0 or not r.stdout or len(r.stdout) > MAX_SCRIPT:
        return None
    return "sha256:" + hashlib.sha256(r.stdout).hexdigest()[:16]


def _number(value: object) -> int | None:
    if isinstance(value, dict):  # newer Slurm: {"set": true, "number": ...}
        value = value.get("number") if value.get("set", True) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def with_slurm_info(spool: Spool, meta: JobMeta, cfg: SiteConfig) -> JobMeta:
    if meta.submit_time is not None or not cfg.phases.submit_time:
        return meta
    info = slurm_job_info(meta.job_id, cfg.phases.squeue, cfg.phases.squeue_timeout)
    if not info:
        return meta
    known = {k: v for k, v in meta.to_dict().items() if v not in ("", None)}
    meta = JobMeta.from_dict(
        {**meta.to_dict(), **info, **known, "submit_time": info.get("submit_time")}
    )
    # A spool the job filled to its cap (its marks) refuses the cached copy: keep the rows.
    with contextlib.suppress(OSError):
        spool.write_meta(meta)
    return meta


def _stamp(rows: list[PhaseRow], meta: JobMeta) -> list[PhaseRow]:
    """Rows spooled before Slurm answered get what it said."""
    fill = {
        k: getattr(meta, k)
        for k in ("submit_time", "job_name", "account", "array_job_id", "array_task_id", "script")
        if getattr(meta, k) not in ("", None)
    }
    if not fill:
        return rows
    return [
        PhaseRow.from_dict(
            {**r.to_dict(), **{k: v for k, v in fill.items() if getattr(r, k) in ("", None)}}
        )
        for r in rows
    ]


def flush(
    spool: Spool,
    store: Store,
    mode: Flush,
    cfg: SiteConfig,
    extra: Sequence[PhaseRow] = (),
    first_node: bool = False,
    meta: JobMeta | None = None,
) -> tuple[str | None, list[str]]:
    """Write what ``mode`` (prolog, marks, epilog) covers; return the key and any problems.
    ``meta`` is the spool's, where the caller has read it already; ``first_node`` asks
    Slurm for what the spool's metadata lacks (the job's first node does, once)."""
    meta = spool.meta() if meta is None else meta
    if first_node and mode in ("prolog", "epilog"):
        meta = with_slurm_info(spool, meta, cfg)
    rows: list[PhaseRow] = []
    problems: list[str] = []
    if mode in ("prolog", "epilog"):
        rows += spool.hook_rows()
    if mode in ("marks", "epilog"):
        events, problems = spool.marks(cfg.phases.max_marks_bytes)
        hooks = [e for e in events if e.phase in HOOK_PHASES]
        if hooks:  # the job's window is the hooks' rows: a mark may not stretch it
            problems.append(
                f"{len(hooks)} mark(s) named like a hook phase ignored "
                f"({', '.join(sorted({e.phase for e in hooks}))})"
            )
            events = [e for e in events if e.phase not in HOOK_PHASES]
        rows += rows_from_marks(events, meta, final=(mode == "epilog"))
    rows += extra
    keys, missing = sealing_keys(cfg)
    problems += missing
    return write_rows(store, _stamp(rows, meta), source=mode, keys=keys), problems


def sealing_keys(cfg: SiteConfig) -> tuple[SiteKeys | None, list[str]]:
    """The keys a flush seals with (:mod:`bootseer.phases.seal`): the site's, run as root;
    None as a user (no key: the file is unsealed, and root's reports will not count it).
    Root without a usable key still writes the rows, unsealed, and says why."""
    if os.geteuid() != 0:
        return None, []
    keys = site_keys(cfg)
    if not keys.keys:
        return None, [f"rows written unsealed (root's reports will not count them): {keys.missing}"]
    return keys, []


# The early flushes' CPU priority (their process's): background work, as image.fetch's fill.
BACKGROUND_NICE = 19


def main(argv: Sequence[str] | None = None) -> int:
    from bootseer.config import load_config
    from bootseer.errors import BootseerError

    p = argparse.ArgumentParser(prog="python -m bootseer.phases.flush")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--prolog", dest="mode", action="store_const", const="prolog")
    mode.add_argument("--marks", dest="mode", action="store_const", const="marks")
    p.add_argument("--first-node", action="store_true", help="the job's first node (prolog)")
    p.add_argument("spool", type=Path)
    args = p.parse_args(argv)
    spool = Spool.at(args.spool)
    try:
        cfg = load_config()
        store = cfg.store.open()
        first = args.mode == "prolog" and args.first_node
        key, problems = flush(spool, store, args.mode, cfg, first_node=first)
    except (BootseerError, OSError, ValueError) as exc:
        print(f"bootseer phase flush: {describe(exc)}", file=sys.stderr)
        return 1
    for problem in problems:
        print(f"bootseer phase flush: {problem}", file=sys.stderr)
    if key and os.isatty(1):
        print(key)
    return 0


if __name__ == "__main__":
    from bootseer.nonumpy import without_numpy

    without_numpy()  # before pyarrow: a flush never uses NumPy (bootseer.nonumpy)
    with contextlib.suppress(OSError):  # before any thread: they inherit it
        os.setpriority(os.PRIO_PROCESS, 0, BACKGROUND_NICE)
    sys.exit(main())
