"""What a hook step is: the call a step gets, the result it returns, the rows it adds.

A step is a function ``step(call: StepCall) -> StepResult``. It lives in its
technique's package (``bootseer.image``, ``bootseer.deps``, ``bootseer.ckpt``), which
imports this module and nothing of the hooks; the hook runner (:mod:`bootseer.hooks`)
names the steps (:mod:`bootseer.hooks.steps`), calls them and records what they return.
A step must leave nothing half-done that a later run would trust: it publishes its
work atomically (a rename, a complete upload) or not at all.

The runner turns what a step returns into that step's phase row, plus any further rows
in :attr:`StepResult.rows` (work the step learned of but did not span, such as the
image's background fill), and the phase records (:mod:`bootseer.phases.hooks`) add the
job's metadata to each.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, get_args

if TYPE_CHECKING:
    from bootseer.config import SiteConfig
    from bootseer.context import JobContext

Hook = Literal["prolog", "epilog"]
HOOKS: tuple[Hook, ...] = get_args(Hook)

# What became of a phase: a step's, the hook's, or one the job marked itself.
Outcome = Literal["ok", "failed", "skipped", "timed_out"]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)


class JobState(Protocol):
    """The job's directory on this node, as a step keeps its state there between
    prolog and epilog (:class:`bootseer.jobdir.JobDir`)."""

    @property
    def path(self) -> Path: ...

    def sub(self, name: str, mode: int = 0o700) -> Path:
        """The step's own directory in it, made on first use: root's alone (0700), or
        ``mode``."""
        ...


# The hook's log on this node (bootseer.hooks.log.HookLog): one line per call.
StepLog = Callable[[str], None]


@dataclass
class StepCall:
    ctx: JobContext
    cfg: SiteConfig
    job: JobState
    log: StepLog
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
    outcome: Outcome = "ok"
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
    outcome: Literal["ok", "skipped"] = "ok"  # skipped: the step found nothing to do
    # Phase rows beside the step's own (which the runner makes from the fields above).
    rows: list[StepRow] = field(default_factory=list)
