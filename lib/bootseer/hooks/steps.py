"""Which hook steps exist: the prolog's and the epilog's, each named by import path.

A step (:mod:`bootseer.stepapi`: ``step(call: StepCall) -> StepResult``) lives in its
technique's package (``bootseer.image``, ``bootseer.deps``, ``bootseer.ckpt``) and is
named here by import path, so a job that asks for one technique never imports the others.

Each step is a phase of the job's startup or teardown, named in its :class:`StepSpec`
(prolog ``image`` is ``image_prefetch``) from the phase names of
:mod:`bootseer.phases.schema`, whose phase order is this table's.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bootseer.phases import schema
from bootseer.stepapi import Hook, StepCall, StepResult

if TYPE_CHECKING:
    from bootseer.context import JobContext


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

    def phase_in(self, hook: Hook) -> str:
        return self.phase or f"{hook}_{self.name}"

    def load(self) -> Callable[[StepCall], StepResult]:
        module, _, func = self.target.partition(":")
        fn: Callable[[StepCall], StepResult] = getattr(importlib.import_module(module), func)
        return fn


# Steps of one hook run in parallel: they are independent by design (each keys its
# work on the job's options alone).
# A table's phases, in its order, are the schema's (PROLOG_PHASES, EPILOG_PHASES; a test
# holds the two together).
PROLOG_STEPS: tuple[StepSpec, ...] = (
    StepSpec(
        "image",
        "bootseer.image.step:prolog",
        lambda ctx: ctx.options.image is not None,
        phase=schema.IMAGE_PREFETCH,
    ),
    StepSpec(
        "deps",
        "bootseer.deps.step:prolog",
        lambda ctx: ctx.options.deps is not None,
        # The job's install command names it ("$BOOTSEER_DEPS_PREFIX"), restore or not.
        env=lambda ctx: (
            {"BOOTSEER_DEPS_PREFIX": ctx.options.deps.prefix} if ctx.options.deps else {}
        ),
        phase=schema.DEPS_RESTORE,
    ),
    StepSpec(
        "ckpt",
        "bootseer.ckpt.step:prolog",
        lambda ctx: ctx.options.ckpt is not None,
        phase=schema.CKPT_MOUNT,
    ),
)
EPILOG_STEPS: tuple[StepSpec, ...] = (
    StepSpec(
        "image",
        "bootseer.image.step:epilog",
        lambda ctx: ctx.options.image is not None,
        phase=schema.IMAGE_TRACE,  # and image_background_fill, a row of its result
    ),
    StepSpec(
        "deps",
        "bootseer.deps.step:epilog",
        lambda ctx: ctx.options.deps is not None,
        phase=schema.DEPS_CAPTURE,
    ),
    StepSpec(
        "ckpt",
        "bootseer.ckpt.step:epilog",
        lambda ctx: ctx.options.ckpt is not None,
        phase=schema.CKPT_UNMOUNT,
    ),
)


def steps_for(hook: Hook, ctx: JobContext) -> list[StepSpec]:
    table = PROLOG_STEPS if hook == "prolog" else EPILOG_STEPS
    return [s for s in table if s.wanted(ctx)]
