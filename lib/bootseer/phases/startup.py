"""What *startup* is: the one definition the job report and the cluster view share.

- A run's *allocation* is its earliest row (its first prolog starts when Slurm allocates).
- A phase *belongs to startup* unless it is one of the job's end (the epilog's:
  :data:`~bootseer.phases.schema.TEARDOWN_PHASES`).
- Startup *ends* with the end of the last ``first_step`` (the job's own mark of its first
  training step), or, in a run that marked none, with the end of its last startup phase.
- *Startup* is allocation to that end (never negative).

The job report applies it to rows (:func:`startup_end`), the cluster view to columns of
a year of rows at once (:func:`run_columns`, :func:`end_column`); a test holds the two
to one answer.

    >>> from bootseer.phases.schema import JobMeta
    >>> m = JobMeta(job_id=7, node="n1")
    >>> rows = [m.row("prolog", 0, 2), m.row("first_step", 5, 9), m.row("epilog", 20, 21)]
    >>> end = startup_end(rows)
    >>> end.phase, startup_seconds(allocation(rows), end.end)
    ('first_step', 9.0)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from bootseer.phases.schema import STARTUP_END, TEARDOWN_PHASES, PhaseRow

if TYPE_CHECKING:
    import pyarrow as pa


def in_startup(phase: str) -> bool:
    return phase not in TEARDOWN_PHASES


def allocation(rows: Iterable[PhaseRow]) -> float:
    return min(r.start for r in rows)


def startup_end(rows: Iterable[PhaseRow]) -> PhaseRow | None:
    """The row whose end ends startup: the last-ending ``first_step``, else the
    last-ending startup phase; None if ``rows`` hold no startup phase."""
    rows = [r for r in rows if in_startup(r.phase)]
    steps = [r for r in rows if r.phase == STARTUP_END]
    return max(steps or rows, key=lambda r: r.end, default=None)


def startup_seconds(allocated: float, end: float) -> float:
    return max(0.0, end - allocated)


# -- the same, column-wise (pyarrow), for the cluster view --------------------------------


def run_columns(phase: pa.ChunkedArray, end: pa.Array) -> dict[str, object]:
    """Per row: ``step_end`` (its end if it is a ``first_step``) and ``ready_end`` (its
    end if it belongs to startup), null otherwise; a run's maxima go to :func:`end_column`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    null = pa.scalar(None, pa.float64())
    return {
        "step_end": pc.if_else(pc.equal(phase, STARTUP_END), end, null),
        "ready_end": pc.if_else(in_startup_column(phase), end, null),
    }


def end_column(step_end_max: Any, ready_end_max: Any) -> Any:
    """Each run's startup end from the maxima of :func:`run_columns`."""
    import pyarrow.compute as pc

    return pc.coalesce(step_end_max, ready_end_max)


def seconds_column(allocated: Any, end: Any) -> Any:
    import pyarrow.compute as pc

    return pc.max_element_wise(pc.subtract(end, allocated), 0.0)


def in_startup_column(phase: Any) -> Any:
    """:func:`in_startup` of each row's phase."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.invert(pc.is_in(phase, value_set=pa.array(sorted(TEARDOWN_PHASES))))
