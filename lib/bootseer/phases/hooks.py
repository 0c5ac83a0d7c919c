"""Phase records from the Prolog and Epilog: the hook runner calls :func:`record_hook_run`.

Each step outcome becomes a row named by :func:`bootseer.phases.schema.phase_for_step`
(prolog ``image`` -> ``image_prefetch``, ...), and the whole hook a row of its own
(``prolog``, ``epilog``) that starts when the hook's process did.

The prolog keeps its rows in the node's spool, makes the spool's marks file for the
job's user, tells the tasks where it is (``BOOTSEER_PHASE_MARKS``), and leaves the
Parquet write to a detached process. The epilog writes everything inline and
removes the spool.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bootseer.phases.marks import MARKS_ENV
from bootseer.phases.schema import JobMeta, PhaseRow, phase_for_step
from bootseer.phases.spool import Spool, remove_stale

if TYPE_CHECKING:
    from bootseer.config import SiteConfig
    from bootseer.context import JobContext
    from bootseer.hooks.runner import HookRun


def meta_for(ctx: JobContext) -> JobMeta:
    return JobMeta(
        job_id=ctx.job_id,
        restart_count=ctx.restart_count,
        job_name=ctx.job_name,
        user=ctx.user,
        account=ctx.account,
        node=ctx.node,
        node_count=max(1, len(ctx.nodes)),
        gpus_per_node=ctx.gpus_per_node,
    )


def process_start_time() -> float | None:
    """When this process started (wall clock, ~10 ms), from /proc; None elsewhere."""
    try:
        stat = Path("/proc/self/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22, starttime
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def hook_rows(hook: str, meta: JobMeta, run: HookRun, now: float) -> list[PhaseRow]:
    rows = [
        meta.row(
            phase_for_step(hook, o.step),
            o.start,
            o.end,
            o.outcome,
            o.bytes,
            o.detail,
            store_bytes=o.store_bytes,
            peer_bytes=o.peer_bytes,
        )
        for o in run.outcomes
    ]
    began = process_start_time() or min((o.start for o in run.outcomes), default=now)
    bad = [f"{o.step} {o.outcome}" for o in run.outcomes if o.outcome in ("failed", "timed_out")]
    steps = ", ".join(o.step for o in run.outcomes) or "none"
    detail = f"steps: {steps}" + (f"; {', '.join(bad)}" if bad else "")
    rows.insert(0, meta.row(hook, min(began, now), now, "failed" if bad else "ok", detail=detail))
    return rows


def marks_template(cfg: SiteConfig, job_id: int) -> str:
    """The marks path with ``%n`` for the node where the site config's run_dir has it.

    srun hands the batch step's environment to every task, where it can override what
    the SPANK plugin set from the node's own env file; a task therefore resolves ``%n``
    itself (from ``$SLURMD_NODENAME``). On a real cluster run_dir has no ``%n`` and the
    path is the same, node-local, everywhere.
    """
    raw = cfg.template.paths.run_dir if cfg.template else cfg.paths.run_dir
    return str(Spool(raw, job_id).marks_path)


def record_hook_run(hook: str, ctx: JobContext, cfg: SiteConfig, run: HookRun) -> dict[str, str]:
    """Record one prolog or epilog run on this node (called by the hook runner); the
    variables the job's tasks need for their own marks (the runner writes them with the
    steps' own)."""
    if not cfg.phases.enabled:
        return {}
    now = time.time()
    spool = Spool(cfg.paths.run_dir, ctx.job_id)
    if hook == "prolog":
        _prolog(ctx, cfg, run, spool, now)
        return {MARKS_ENV: marks_template(cfg, ctx.job_id)}
    _epilog(ctx, cfg, run, spool, now)
    return {}


def _prolog(ctx: JobContext, cfg: SiteConfig, run: HookRun, spool: Spool, now: float) -> None:
    meta = meta_for(ctx)
    remove_stale(cfg.paths.run_dir, keep=ctx.job_id, now=now)
    spool.create(meta, ctx.uid, ctx.gid)
    if ctx.first_node:
        (spool.path / "first-node").touch()
    spool.append_rows(hook_rows("prolog", meta, run, now))
    if cfg.phases.background_flush:
        from bootseer.phases.spawn import spawn_flush

        spawn_flush("prolog", str(spool.path))
    else:
        _flush_inline(spool, cfg, "prolog", first_node=ctx.first_node)


def _epilog(ctx: JobContext, cfg: SiteConfig, run: HookRun, spool: Spool, now: float) -> None:
    from bootseer.phases.writer import write_rows

    if spool.exists():
        meta = spool.meta()
        rows = hook_rows("epilog", meta, run, now)
        try:
            _flush_inline(spool, cfg, "epilog", extra=rows, first_node=ctx.first_node)
        finally:
            spool.remove()
        return
    # No spool: the prolog did not record (phases were off, or it failed early).
    write_rows(cfg.store.open(), hook_rows("epilog", meta_for(ctx), run, now), source="epilog")


def _flush_inline(
    spool: Spool,
    cfg: SiteConfig,
    mode: str,
    extra: list[PhaseRow] | None = None,
    first_node: bool = False,
) -> None:
    from bootseer.phases.flush import flush

    _, problems = flush(
        spool, cfg.store.open(), mode, cfg, extra=extra or [], first_node=first_node
    )
    if problems:
        with contextlib.suppress(Exception):
            from bootseer.hooks.log import HookLog

            log = HookLog(cfg.paths.log_dir, spool.meta().node, spool.meta().job_id, mode)
            for p in problems:
                log(f"phase marks: {p}")
            log.close()
