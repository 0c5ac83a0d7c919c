"""``python -m bootseer.hooks prolog|epilog``: the Python side of the Slurm hooks.

Both hooks run their steps (:mod:`bootseer.hooks.runner`), then record the run's phase
rows (:mod:`bootseer.phases.hooks`); the prolog then writes the job's env file, the
epilog removes the job dir, last, once nothing reads it any more.

Exit status is what Slurm acts on: 0 lets the job start (prolog) or the node return
to service (epilog). It is non-zero only in strict mode after a failed step, or for
a usage error by whoever runs it by hand.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from pathlib import Path

from bootseer.choices import one_of
from bootseer.config import SiteConfig, load_config
from bootseer.context import JobContext, wants_bootseer
from bootseer.errors import BootseerError
from bootseer.hooks.log import HookLog
from bootseer.hooks.runner import HookRun, run_steps
from bootseer.jobdir import JobDir
from bootseer.nodepaths import node_name
from bootseer.stepapi import HOOKS, Hook

USAGE = "usage: python -m bootseer.hooks prolog|epilog"


def main(argv: list[str]) -> int:
    hook = one_of(argv[0], HOOKS) if len(argv) == 1 else None
    if hook is None:
        print(USAGE, file=sys.stderr)
        return 2
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
        from bootseer.hooks.badconfig import record_bad_config

        try:  # the report and the metrics show it: Slurm drops what the hook prints
            record_bad_config(hook, env, node, exc, t0)
        except Exception as problem:
            print(f"bootseer {hook}: config problem not recorded: {problem!r}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(0)  # a records thread past its deadline must not hold the hook
    log = HookLog(cfg.paths.log_dir, node, env.get("SLURM_JOB_ID", "?"), hook)
    until = t0 + cfg.hook_deadline(hook)
    try:
        status = _run(hook, cfg, log, until)
    except BootseerError as exc:
        log(f"outcome=failed: {exc}")
        status = 1 if cfg.hooks.strict else 0
        _count(hook, cfg, None, log, until)
    except Exception as exc:
        log(f"outcome=failed: unexpected {exc!r}")
        status = 1 if cfg.hooks.strict else 0
        _count(hook, cfg, None, log, until)
    log(f"done secs={time.monotonic() - t0:.3f} exit={status}")
    log.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # A step past its deadline may still hold a thread; the hook must not wait for it.
    os._exit(status)


def _run(hook: Hook, cfg: SiteConfig, log: HookLog, until: float) -> int:
    """The hook's work, all of it done or given up by ``until`` (``time.monotonic()``):
    the steps end :meth:`SiteConfig.records_reserve` before it, the records by it."""
    ctx = JobContext.from_env(os.environ)
    log(
        f"start user={ctx.user} nodes={len(ctx.nodes)} restart={ctx.restart_count} "
        f"mode={ctx.options.mode}"
    )
    job = JobDir(cfg.paths.run_dir, ctx.job_id)
    if hook == "prolog":
        job.create()
    run = run_steps(hook, ctx, cfg, job, log, until=until - cfg.records_reserve(hook))
    marks_env = _record(hook, ctx, cfg, run, log, until)
    if hook == "prolog":
        notice = run.notice(ctx.node)
        job.write_env({**run.env, **marks_env, **({"BOOTSEER_NOTICE": notice} if notice else {})})
    else:
        job.remove()
    _count(hook, cfg, run, log, until)
    return 1 if (run.failed and cfg.hooks.strict) else 0


def _count(hook: Hook, cfg: SiteConfig, run: HookRun | None, log: HookLog, until: float) -> None:
    """Add the run (None: one that failed before its steps' account) to the node's hook
    metrics (``[metrics] textfile_dir``; off unset), waiting for the lock until ``until``
    at most (once past it, one try)."""
    if cfg.metrics.textfile_dir is None:
        return
    from bootseer.metrics.hooks import LOCK_WAIT, HookSample, record

    began = process_start_time()
    seconds = time.time() - began if began is not None else 0.0
    sample = HookSample(hook, "failed", seconds) if run is None else run.sample(hook, seconds)
    from bootseer import sitekey  # the records this run refused

    refused = tuple((p, sitekey.refused[p]) for p in sitekey.PURPOSES)
    sample = dataclasses.replace(sample, refused=refused)
    wait = min(LOCK_WAIT, max(0.0, until - time.monotonic()))
    record(cfg.metrics.textfile_dir, sample, log, wait=wait)


def process_start_time() -> float | None:
    """When this process started (wall clock, ~10 ms), from /proc; None elsewhere: the
    hook's phase row starts there, Python's own start-up included."""
    try:
        stat = Path("/proc/self/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22, starttime
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def _record(
    hook: Hook, ctx: JobContext, cfg: SiteConfig, run: HookRun, log: HookLog, until: float
) -> dict[str, str]:
    """Hand the run's phase rows to the phase records; the variables the job's marks need.

    The records go to the store, which may hang (paused, partitioned) rather than fail:
    they are written in a thread the hook waits for only until its deadline. A hook
    past its deadline would be killed by slurmd, and a killed epilog drains the node.
    """
    from bootseer.phases import hooks as phase_hooks

    box: dict[str, dict[str, str]] = {}
    failed: list[BaseException] = []
    rows = run.phase_rows(hook, began=process_start_time(), now=time.time())

    def write() -> None:
        try:
            box["env"] = phase_hooks.record_hook_run(hook, ctx, cfg, rows, log)
        except BaseException as exc:  # reported by the hook's thread below
            failed.append(exc)

    worker = threading.Thread(target=write, name=f"{hook}-records", daemon=True)
    worker.start()
    worker.join(max(0.0, until - time.monotonic()))
    if worker.is_alive():
        log(
            f"phase records not written: no answer from the store within the hook's deadline "
            f"({cfg.hook_deadline(hook):g}s); left behind"
        )
        return {}
    if failed:  # records are worth a log line, never a failed job
        log(f"phase records not written: {failed[0]!r}")
        return {}
    return box.get("env", {})
