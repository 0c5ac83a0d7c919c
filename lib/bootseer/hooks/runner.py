"""Run one hook's steps in parallel, each under its deadline, and account for each.

A step that raises or overruns is logged and skipped; the job starts the ordinary
way. Only in strict mode does a failed step fail the hook (and Slurm then drains the
node and requeues the job, which is what a site that chose strict mode wants).

The run's account is also its phase rows (:meth:`HookRun.phase_rows`): one for the
hook, one for each step (named by its :class:`~bootseer.hooks.steps.StepSpec`), and
whatever further rows a step returned; :mod:`bootseer.hooks.main` records them, and
counts the run in the node's metrics (:meth:`HookRun.sample`).
"""

from __future__ import annotations

import concurrent.futures as cf
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bootseer.config import SiteConfig
from bootseer.context import JobContext
from bootseer.errors import BootseerError
from bootseer.hooks.log import HookLog
from bootseer.hooks.steps import StepSpec, steps_for
from bootseer.jobdir import JobDir
from bootseer.stepapi import Hook, Outcome, StepCall, StepResult, StepRow

if TYPE_CHECKING:
    from bootseer.metrics.hooks import HookSample


@dataclass
class StepOutcome:
    """One step's account: what ends up in the log and the phase records."""

    step: str
    outcome: Outcome
    start: float  # wall-clock seconds since the epoch
    end: float
    bytes: int = 0
    detail: str = ""
    store_bytes: int = 0
    peer_bytes: int = 0
    phase: str = ""  # the step's own phase row (its StepSpec's); "" for the step's name
    extra: list[StepRow] = field(default_factory=list)  # the rows its result added

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def phase_rows(self) -> list[StepRow]:
        own = StepRow(
            self.phase or self.step,
            self.start,
            self.end,
            self.outcome,
            self.bytes,
            self.detail,
            self.store_bytes,
            self.peer_bytes,
        )
        return [own, *self.extra]


NOTICE_WHY = 240  # characters of a step's failure a job's stderr is told


@dataclass
class HookRun:
    outcomes: list[StepOutcome]
    env: dict[str, str]
    abandoned: bool  # a step thread is still running past its deadline

    @property
    def failed(self) -> bool:
        return any(o.outcome in ("failed", "timed_out") for o in self.outcomes)

    def notice(self, node: str) -> str:
        """One line for the job's stderr naming what it asked for and did not get on
        ``node`` (its steps that failed or timed out, and why); "" when it got all."""
        missed = []
        for o in self.outcomes:
            if o.outcome in ("failed", "timed_out"):
                why = " ".join(o.detail.split())
                why = why if len(why) <= NOTICE_WHY else why[: NOTICE_WHY - 3] + "..."
                missed.append(f"--bootseer-{o.step} ({o.outcome}: {why})")
        if not missed:
            return ""
        return f"bootseer on {node}: not set up: {'; '.join(missed)}; the job runs without it"

    def phase_rows(self, hook: Hook, began: float | None, now: float) -> list[StepRow]:
        """The hook's own row (``began``, when its process started, to ``now``: failed
        if a step was), then every step's rows in the table's order."""
        bad = [
            f"{o.step} {o.outcome}" for o in self.outcomes if o.outcome in ("failed", "timed_out")
        ]
        steps = ", ".join(o.step for o in self.outcomes) or "none"
        if began is None:
            began = min((o.start for o in self.outcomes), default=now)
        detail = f"steps: {steps}" + (f"; {', '.join(bad)}" if bad else "")
        rows = [StepRow(hook, min(began, now), now, "failed" if bad else "ok", detail=detail)]
        for o in self.outcomes:
            rows += o.phase_rows()
        return rows

    def sample(self, hook: Hook, seconds: float) -> HookSample:
        """What the run adds to the node's hook metrics (:mod:`bootseer.metrics.hooks`,
        imported only where metrics are on)."""
        from bootseer.metrics.hooks import BytesSample, HookSample, StepSample

        return HookSample(
            hook,
            "failed" if self.failed else "ok",
            seconds,
            tuple(StepSample(o.step, o.outcome, o.seconds) for o in self.outcomes),
            tuple(
                BytesSample(r.phase, r.bytes, r.store_bytes, r.peer_bytes)
                for o in self.outcomes
                for r in o.phase_rows()
            ),
        )


def _failpoint(cfg: SiteConfig, step: str) -> None:
    for fp in cfg.hooks.failpoints:
        name, _, action = fp.partition(":")
        if name != step:
            continue
        if action == "raise":
            raise RuntimeError(f"failpoint {fp} (site config hooks.failpoints)")
        if action == "hang":
            time.sleep(3600)


def _run_one(spec: StepSpec, call: StepCall) -> StepResult:
    _failpoint(call.cfg, spec.name)
    return spec.load()(call)


def run_steps(
    hook: Hook,
    ctx: JobContext,
    cfg: SiteConfig,
    job: JobDir,
    log: HookLog,
    until: float | None = None,
) -> HookRun:
    """Run the hook's steps; none runs past its own deadline nor past ``until`` (a
    ``time.monotonic()``: where the hook's deadline leaves room for its records)."""
    specs = steps_for(hook, ctx)
    if not specs:
        log("no steps asked for")
        return HookRun([], {}, abandoned=False)
    started = {s.name: (time.time(), time.monotonic()) for s in specs}
    pool = cf.ThreadPoolExecutor(max_workers=len(specs), thread_name_prefix=f"{hook}-step")
    futures: dict[cf.Future[StepResult], StepSpec] = {}
    deadlines = {}
    allowed: dict[str, float] = {}
    for spec in specs:
        now = time.monotonic()
        allowed[spec.name] = cfg.deadline(hook, spec.name)
        if until is not None and until - now < allowed[spec.name]:
            allowed[spec.name] = round(max(0.0, until - now), 1)
        deadline = now + allowed[spec.name]
        deadlines[spec.name] = deadline
        call = StepCall(ctx=ctx, cfg=cfg, job=job, log=log, deadline=deadline)
        futures[pool.submit(_run_one, spec, call)] = spec

    outcomes: list[StepOutcome] = []
    env: dict[str, str] = {}
    for spec in specs:  # promised whatever the step's outcome
        env.update(spec.env(ctx))
    pending = set(futures)
    while pending:
        next_deadline = min(deadlines[futures[f].name] for f in pending)
        done, pending = cf.wait(
            pending,
            timeout=max(0.0, next_deadline - time.monotonic()),
            return_when=cf.FIRST_COMPLETED,
        )
        for fut in done:
            spec = futures[fut]
            outcomes.append(_account(hook, spec, fut, started[spec.name][0], log, env))
        now = time.monotonic()
        for fut in [f for f in pending if deadlines[futures[f].name] <= now]:
            spec = futures[fut]
            pending.discard(fut)
            secs = allowed[spec.name]
            outcomes.append(
                StepOutcome(
                    spec.name,
                    "timed_out",
                    started[spec.name][0],
                    time.time(),
                    detail=f"no result within its deadline of {secs:g}s",
                    phase=spec.phase_in(hook),
                )
            )
            log(
                f"step={spec.name} outcome=timed_out deadline={secs:g}s: "
                "skipped, job starts without it"
            )
    abandoned = any(not f.done() for f in futures)
    pool.shutdown(wait=False, cancel_futures=True)
    order = {s.name: i for i, s in enumerate(specs)}
    outcomes.sort(key=lambda o: order[o.step])
    return HookRun(outcomes, env, abandoned)


def _account(
    hook: Hook,
    spec: StepSpec,
    fut: cf.Future[StepResult],
    start: float,
    log: HookLog,
    env: dict[str, str],
) -> StepOutcome:
    end = time.time()
    phase = spec.phase_in(hook)
    try:
        result = fut.result()
    except BootseerError as exc:
        log(f"step={spec.name} outcome=failed secs={end - start:.3f}: {exc}")
        return StepOutcome(spec.name, "failed", start, end, detail=str(exc), phase=phase)
    except Exception as exc:
        tb = traceback.format_exc().strip().replace("\n", " | ")
        log(f"step={spec.name} outcome=failed secs={end - start:.3f}: unexpected {exc!r}: {tb}")
        return StepOutcome(
            spec.name, "failed", start, end, detail=f"unexpected error: {exc!r}", phase=phase
        )
    env.update(result.env)
    sources = (
        f"store_bytes={result.store_bytes} peer_bytes={result.peer_bytes} "
        if result.store_bytes or result.peer_bytes
        else ""
    )
    log(
        f"step={spec.name} outcome={result.outcome} secs={end - start:.3f} "
        f"bytes={result.bytes} {sources}{result.detail}".rstrip()
    )
    return StepOutcome(
        spec.name,
        result.outcome,
        start,
        end,
        result.bytes,
        result.detail,
        store_bytes=result.store_bytes,
        peer_bytes=result.peer_bytes,
        phase=phase,
        extra=list(result.rows),
    )
