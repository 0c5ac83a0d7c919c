"""Hook steps called as the hook runner calls them, for the step tests of every technique.

call = step_call(cfg, job_context(options=Options(mode="on", image="/images/x.sqsh")))
result = bootseer.image.step.prolog(call)
"""

from __future__ import annotations

import os
import time
from typing import Any

from bootseer.config import SiteConfig
from bootseer.context import JobContext
from bootseer.hooks.log import HookLog
from bootseer.jobdir import JobDir
from bootseer.options import Options
from bootseer.stepapi import StepCall


def job_context(
    options: Options | None = None,
    *,
    job_id: int = 7,
    user: str = "root",
    uid: int | None = None,
    node: str = "n1",
    nodes: tuple[str, ...] = ("n1",),
    **fields: Any,
) -> JobContext:
    """A job of ``user`` (by default this process's own ids; ``uid`` sets both ids)."""
    return JobContext(
        job_id=job_id,
        user=user,
        uid=os.getuid() if uid is None else uid,
        gid=os.getgid() if uid is None else uid,
        node=node,
        nodes=nodes,
        options=options or Options(mode="on"),
        **fields,
    )


def step_call(
    cfg: SiteConfig, ctx: JobContext, hook: str = "prolog", seconds: float = 30.0
) -> StepCall:
    """What the runner hands a step: the site config for the job's node (``%n``), the job
    dir (created), the node's hook log and a deadline ``seconds`` away."""
    cfg = cfg.for_node(ctx.node)
    return StepCall(
        ctx=ctx,
        cfg=cfg,
        job=JobDir(cfg.paths.run_dir, ctx.job_id).create(),
        log=HookLog(cfg.paths.log_dir, ctx.node, ctx.job_id, hook),
        deadline=time.monotonic() + seconds,
    )
