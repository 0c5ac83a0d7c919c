"""Phase records from the Prolog and Epilog: the hook runner calls :func:`record_hook_run`
with the rows of its run (:class:`bootseer.stepapi.StepRow`: the hook's, each step's, and
those the steps returned), and this module adds the job's metadata.

The prolog keeps its rows in the node's spool, makes the spool's marks file for the
job's user, tells the tasks where it is (``BOOTSEER_PHASE_MARKS``), and leaves the
Parquet write to a detached process. The epilog writes everything inline and
removes the spool.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from bootseer.phases.marks import MARKS_ENV
from bootseer.phases.schema import JobMeta, PhaseRow
from bootseer.phases.spool import Spool, remove_stale

if TYPE_CHECKING:
    from bootseer.config import SiteConfig
    from bootseer.context import JobContext
    from bootseer.stepapi import Hook, StepRow


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


def rows_for(meta: JobMeta, rows: Sequence[StepRow]) -> list[PhaseRow]:
    return [
        meta.row(
            r.phase,
            r.start,
            r.end,
            r.outcome,
            r.bytes,
            r.detail,
            store_bytes=r.store_bytes,
            peer_bytes=r.peer_bytes,
        )
        for r in rows
    ]


def marks_template(cfg: SiteConfig, job_id: int) -> str:
    """The marks path with ``%n`` for the node where the site config's run_dir has it.

    srun hands the batch step's environment to every task, where it can override what
    the SPANK plugin set from the node's own env file; a task therefore resolves ``%n``
    itself (from ``$SLURMD_NODENAME``). On a real cluster run_dir has no ``%n`` and the
    path is the same, node-local, everywhere.
    """
    raw = cfg.template.paths.run_dir if cfg.template else cfg.paths.run_dir
    return str(Spool(raw, job_id).marks_path)


def record_hook_run(
    hook: Hook,
    ctx: JobContext,
    cfg: SiteConfig,
    rows: Sequence[StepRow],
    log: Callable[[str], object],
) -> dict[str, str]:
    """Record one prolog or epilog run on this node (called by the hook runner, whose log
    gets what was wrong with the job's marks); the variables the job's tasks need for
    their own marks (the runner writes them with the steps' own)."""
    if not cfg.phases.enabled:
        return {}
    spool = Spool(cfg.paths.run_dir, ctx.job_id)
    if hook == "prolog":
        _prolog(ctx, cfg, rows, spool)
        return {MARKS_ENV: marks_template(cfg, ctx.job_id)}
    _epilog(ctx, cfg, rows, spool, log)
    return {}


def _prolog(ctx: JobContext, cfg: SiteConfig, rows: Sequence[StepRow], spool: Spool) -> None:
    meta = meta_for(ctx)
    remove_stale(cfg.paths.run_dir, keep=ctx.job_id)
    spool.create(meta, ctx.uid, ctx.gid, cap=cfg.phases.max_marks_bytes)
    spool.append_rows(rows_for(meta, rows))
    if cfg.phases.background_flush:
        from bootseer.phases.spawn import spawn_flush

        spawn_flush("prolog", str(spool.path), first_node=ctx.first_node)
    else:
        from bootseer.phases.flush import flush

        flush(spool, cfg.store.open(), "prolog", cfg, meta=meta, first_node=ctx.first_node)


def _epilog(
    ctx: JobContext,
    cfg: SiteConfig,
    rows: Sequence[StepRow],
    spool: Spool,
    log: Callable[[str], object],
) -> None:
    from bootseer.phases.flush import flush, sealing_keys
    from bootseer.phases.writer import write_rows

    if not spool.exists():
        # No spool: the prolog did not record (phases were off, or it failed early).
        keys, missing = sealing_keys(cfg)
        write_rows(cfg.store.open(), rows_for(meta_for(ctx), rows), "epilog", keys=keys)
        for p in missing:
            log(f"phase rows: {p}")
        return
    try:
        meta = spool.meta()
        _, problems = flush(
            spool,
            cfg.store.open(),
            "epilog",
            cfg,
            meta=meta,
            extra=rows_for(meta, rows),
            first_node=ctx.first_node,
        )
    finally:
        spool.remove()
    for p in problems:
        log(f"phase marks: {p}")
