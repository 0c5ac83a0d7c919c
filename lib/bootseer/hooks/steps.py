"""What a hook step is, and which steps exist.

A step is a function ``step(call: StepCall) -> StepResult``. It lives in its
technique's package (``bootseer.image``, ``bootseer.deps``, ``bootseer.ckpt``) and is
named here by import path, so a job that asks for one technique never imports the others.
A step must leave nothing half-done that a later run would trust: it publishes its
work atomically (a rename, a complete upload) or not at all.

Each step is a phase of the job's startup or teardown, named in its :class:`StepSpec`
(prolog ``image`` is ``image_prefetch``). The hook runner turns what the step returns into
that phase's row, plus any further rows in :attr:`StepResult.rows` (work the step learned
of but did not span, such as the image's background fill), and records them all.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bootseer.config import SiteConfig
    from bootseer.context import JobContext
    from bootseer.hooks.jobdir import JobDir
    from bootseer.hooks.log import HookLog


@dataclass
class StepCall:
    ctx: JobContext
    cfg: SiteConfig
    job: JobDir
    log: HookLog
    deadline: float  # time.monotonic() by which the step must have returned

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


@dataclass(frozen=True)
class StepRow:
    """One phase on this node as the hook runner records it: the job's metadata (user,
    node count, ...) is added by the phase records (:mod:`bootseer.phases.hooks`)."""

    phase: str
    start: float  # wall-clock seconds since the epoch
    end: float
    outcome: str = "ok"  # ok, failed, skipped, timed_out
    bytes: int = 0
    detail: str = ""
    store_bytes: int = 0  # of ``bytes``: from the shared store,
    peer_bytes: int = 0  # and from the job's other nodes


@dataclass
class StepResult:
    detail: str = ""
    bytes: int = 0
    store_bytes: int = 0  # of what the step moved: from the shared store,
    peer_bytes: int = 0  # and from the job's other nodes
    env: dict[str, str] = field(default_factory=dict)  # exported to the job's tasks
    outcome: str = "ok"  # or "skipped" when the step found nothing to do
    # Phase rows beside the step's own (which the runner makes from the fields above).
    rows: list[StepRow] = field(default_factory=list)


def _no_env(ctx: JobContext) -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class StepSpec:
    name: str
    target: str  # "module:function"
    wanted: Callable[[JobContext], bool]
    # What the job's tasks get whatever becomes of the step (failed, timed out, a
    # failpoint): values known from the job's options alone, which the docs promise.
    env: Callable[[JobContext], dict[str, str]] = _no_env
    phase: str = ""  # the step's phase row; "" for "<hook>_<name>"

    def phase_in(self, hook: str) -> str:
        return self.phase or f"{hook}_{self.name}"

    def load(self) -> Callable[[StepCall], StepResult]:
        module, _, func = self.target.partition(":")
        fn: Callable[[StepCall], StepResult] = getattr(importlib.import_module(module), func)
        return fn


# Steps of one hook run in parallel: they are independent by design (each keys its
# work on the job's options alone).
# The table's order is the report's order of the steps' phases (bootseer.phases.schema).
PROLOG_STEPS: tuple[StepSpec, ...] = (
    StepSpec(
        "image",
        "bootseer.image.step:prolog",
        lambda ctx: ctx.options.image is not None,
        phase="image_prefetch",
    ),
    StepSpec(
        "deps",
        "bootseer.deps.step:prolog",
        lambda ctx: ctx.options.deps is not None,
        # The job's install command names it ("$BOOTSEER_DEPS_PREFIX"), restore or not.
        env=lambda ctx: (
            {"BOOTSEER_DEPS_PREFIX": ctx.options.deps.prefix} if ctx.options.deps else {}
        ),
        phase="deps_restore",
    ),
    StepSpec(
        "ckpt",
        "bootseer.ckpt.step:prolog",
        lambda ctx: ctx.options.ckpt is not None,
        phase="ckpt_mount",
    ),
)
EPILOG_STEPS: tuple[StepSpec, ...] = (
    StepSpec(
        "image",
        "bootseer.image.step:epilog",
        lambda ctx: ctx.options.image is not None,
        phase="image_trace",  # and image_background_fill, a row of its result
    ),
    StepSpec(
        "deps",
        "bootseer.deps.step:epilog",
        lambda ctx: ctx.options.deps is not None,
        phase="deps_capture",
    ),
    StepSpec(
        "ckpt",
        "bootseer.ckpt.step:epilog",
        lambda ctx: ctx.options.ckpt is not None,
        phase="ckpt_unmount",
    ),
)


def steps_for(hook: str, ctx: JobContext) -> list[StepSpec]:
    table = PROLOG_STEPS if hook == "prolog" else EPILOG_STEPS
    return [s for s in table if s.wanted(ctx)]
