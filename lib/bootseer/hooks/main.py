"""``python -m bootseer.hooks prolog|epilog``: the Python side of the Slurm hooks.

Exit status is what Slurm acts on: 0 lets the job start (prolog) or the node return
to service (epilog). It is non-zero only in strict mode after a failed step, or for
a usage error by whoever runs it by hand.
"""

from __future__ import annotations

import os
import sys
import time

from bootseer.config import SiteConfig, load_config
from bootseer.context import JobContext, wants_bootseer
from bootseer.errors import BootseerError
from bootseer.hooks.jobdir import JobDir
from bootseer.hooks.log import HookLog
from bootseer.hooks.runner import HookRun, run_steps
from bootseer.nodepaths import node_name

USAGE = "usage: python -m bootseer.hooks prolog|epilog"


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("prolog", "epilog"):
        print(USAGE, file=sys.stderr)
        return 2
    hook = argv[0]
    env = os.environ
    if not wants_bootseer(env):
        return 0
    t0 = time.monotonic()
    node = node_name(env)
    try:
        cfg = load_config().for_node(node)
    except BootseerError as exc:
        # Without a config there is no log dir either: stderr is all there is.
        print(
            f"bootseer {hook}: {exc}; job {env.get('SLURM_JOB_ID')} starts without bootseer",
            file=sys.stderr,
        )
        return 0
    log = HookLog(cfg.paths.log_dir, node, env.get("SLURM_JOB_ID", "?"), hook)
    try:
        status = _run(hook, cfg, log)
    except BootseerError as exc:
        log(f"outcome=failed: {exc}")
        status = 1 if cfg.hooks.strict else 0
    except Exception as exc:
        log(f"outcome=failed: unexpected {exc!r}")
        status = 1 if cfg.hooks.strict else 0
    log(f"done secs={time.monotonic() - t0:.3f} exit={status}")
    log.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # A step past its deadline may still hold a thread; the hook must not wait for it.
    os._exit(status)


def _run(hook: str, cfg: SiteConfig, log: HookLog) -> int:
    ctx = JobContext.from_env(os.environ)
    log(
        f"start user={ctx.user} nodes={len(ctx.nodes)} restart={ctx.restart_count} "
        f"mode={ctx.options.mode}"
    )
    job = JobDir(cfg.paths.run_dir, ctx.job_id)
    if hook == "prolog":
        job.create()
        run = run_steps(hook, ctx, cfg, job, log)
        marks_env = _record(hook, ctx, cfg, run, log)
        job.write_env({**run.env, **marks_env})
    else:
        run = run_steps(hook, ctx, cfg, job, log)
        job.remove()
        _record(hook, ctx, cfg, run, log)
    return 1 if (run.failed and cfg.hooks.strict) else 0


def _record(
    hook: str, ctx: JobContext, cfg: SiteConfig, run: HookRun, log: HookLog
) -> dict[str, str]:
    """Hand the step outcomes to the phase records; the variables the job's marks need."""
    from bootseer.phases import hooks as phase_hooks

    try:
        return phase_hooks.record_hook_run(hook, ctx, cfg, run)
    except Exception as exc:  # records are worth a log line, never a failed job
        log(f"phase records not written: {exc!r}")
        return {}
