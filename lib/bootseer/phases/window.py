"""A job's marks count inside the job's own window, never beyond it.

Marks are the job's user's: the epilog writes what her process wrote in the spool, so a
mark may claim any time (an end at t=99999999999 once failed ``bootseer report`` for
everyone; one at t=9e9 made the cluster's startup "2001192.0 h"). The hooks' rows
(prolog and epilog phases, written by root with root's clock) bound each run: from the
first hook row's start to the last epilog-phase row's end, or to now while the job runs.
A mark row of that run outside the window is dropped; one that straddles it is clipped
to it. What was dropped or clipped is counted, and the report says so::

    >>> kept = within_windows(table, now=time.time())  # doctest: +SKIP
    >>> kept.dropped, kept.clipped  # doctest: +SKIP
    (1, 0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from bootseer.phases.schema import EPILOG_PHASES, HOOK_PHASES

if TYPE_CHECKING:
    import pyarrow as pa

COLUMNS = ("job_id", "restart_count", "phase", "start", "end")
RUN_KEY = 1_000_000  # job_id * RUN_KEY + restart_count: one int64 per run


@dataclass(frozen=True)
class Kept:
    """``table`` with each mark row inside its run's window; how many were dropped
    (wholly outside, or ending before they start) and clipped (straddling it)."""

    table: pa.Table
    dropped: int = 0
    clipped: int = 0


def within_windows(table: pa.Table, now: float) -> Kept:
    """Mark rows of ``table`` kept to their run's window (hook rows as they are). A run
    without hook rows is bounded by the epoch and ``now``. ``table`` needs
    :data:`COLUMNS`; without them it is returned as it is."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if table.num_rows == 0 or not set(COLUMNS) <= set(table.column_names):
        return Kept(table)
    start_type, end_type = table.schema.field("start").type, table.schema.field("end").type
    start = pc.cast(table["start"], pa.int64())  # microseconds: exact, never out of range
    end = pc.cast(table["end"], pa.int64())
    now_us = int(now * 1_000_000)
    key = pc.add(
        pc.multiply(pc.cast(table["job_id"], pa.int64()), RUN_KEY),
        pc.cast(table["restart_count"], pa.int64()),
    )
    hook = pc.is_in(table["phase"], value_set=pa.array(HOOK_PHASES))
    teardown = pc.is_in(table["phase"], value_set=pa.array(EPILOG_PHASES))
    null = pa.scalar(None, pa.int64())
    runs = (
        pa.table(
            {
                "key": key,
                "lo": pc.if_else(hook, start, null),
                "hi": pc.if_else(teardown, end, null),
            }
        )
        .group_by("key")
        .aggregate([("lo", "min"), ("hi", "max")])
    )
    at = pc.index_in(key, value_set=runs["key"])
    lo = pc.fill_null(pc.take(runs["lo_min"], at), 0)
    hi = pc.fill_null(pc.take(runs["hi_max"], at), now_us)
    mark = pc.invert(hook)
    outside = pc.or_(pc.or_(pc.greater(start, hi), pc.less(end, lo)), pc.less(end, start))
    drop = pc.and_(mark, outside)
    new_start = pc.if_else(mark, pc.max_element_wise(start, lo), start)
    new_end = pc.if_else(mark, pc.min_element_wise(end, hi), end)
    changed = pc.or_(pc.not_equal(new_start, start), pc.not_equal(new_end, end))
    dropped = int(pc.sum(pc.cast(drop, pa.int64())).as_py() or 0)
    clipped = int(pc.sum(pc.cast(pc.and_(changed, pc.invert(drop)), pa.int64())).as_py() or 0)
    if not dropped and not clipped:
        return Kept(table)
    out = table.set_column(
        table.column_names.index("start"), "start", pc.cast(new_start, start_type)
    )
    out = out.set_column(out.column_names.index("end"), "end", pc.cast(new_end, end_type))
    return Kept(out.filter(pc.invert(drop)), dropped, clipped)
