from __future__ import annotations

import pytest

from bootseer.hooks.steps import EPILOG_STEPS, PROLOG_STEPS, StepSpec
from bootseer.phases.schema import (
    COLUMNS,
    EPILOG_PHASES,
    PHASE_ORDER,
    PROLOG_PHASES,
    TEARDOWN_PHASES,
    JobMeta,
    PhaseRow,
    arrow_schema,
    check_phase_name,
    from_table,
    to_table,
)


def test_schema_has_the_issue_columns_in_order() -> None:
    names = [f.name for f in arrow_schema()]
    assert names == [n for n, _ in COLUMNS]
    assert names == [
        "job_id",
        "restart_count",
        "job_name",
        "user",
        "account",
        "node",
        "node_count",
        "gpus_per_node",
        "phase",
        "start",
        "end",
        "outcome",
        "bytes",
        "store_bytes",
        "peer_bytes",
        "detail",
        "submit_time",
        "array_job_id",
        "array_task_id",
        "script",
    ]
    assert str(arrow_schema().field("start").type) == "timestamp[us, tz=UTC]"


def test_rows_round_trip_through_arrow_to_the_microsecond() -> None:
    m = JobMeta(42, 1, "train", "ada", "ml", "n1", 4, 8, submit_time=None)
    rows = [
        m.row("ckpt_load", 1e9 + 0.123456, 1e9 + 12.5, "failed", 7, "disk full"),
        JobMeta(42, 1, node="n2", submit_time=1e9 - 5).row("first_step", 1e9, 1e9),
    ]
    back = from_table(to_table(rows))
    assert back[0] == rows[0]
    assert back[1].submit_time == 1e9 - 5


def test_step_phase_names() -> None:
    phases = {("prolog", s.name): s.phase_in("prolog") for s in PROLOG_STEPS}
    phases |= {("epilog", s.name): s.phase_in("epilog") for s in EPILOG_STEPS}
    assert phases[("prolog", "image")] == "image_prefetch"
    assert phases[("prolog", "deps")] == "deps_restore"
    assert phases[("epilog", "deps")] == "deps_capture"
    assert StepSpec("gpucheck", "x:y", lambda ctx: True).phase_in("prolog") == "prolog_gpucheck"
    assert PHASE_ORDER[:4] == ("prolog", "image_prefetch", "deps_restore", "ckpt_mount")
    assert {"epilog", "image_trace", "deps_capture", "ckpt_unmount"} == TEARDOWN_PHASES


def test_the_hook_phases_are_the_step_tables_in_order() -> None:
    # The schema names the hooks' phases (the report's order); the hooks' step tables
    # say which step records which: a step added to a table needs its phase here.
    assert ("prolog", *(s.phase_in("prolog") for s in PROLOG_STEPS)) == PROLOG_PHASES
    assert ("epilog", *(s.phase_in("epilog") for s in EPILOG_STEPS)) == EPILOG_PHASES


@pytest.mark.parametrize("bad", ["", "1abc", "a b", "x" * 65, "../etc", "ckpt/load"])
def test_bad_phase_names_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid phase name"):
        check_phase_name(bad)


def test_row_from_dict_refuses_bad_types() -> None:
    good = JobMeta(1, node="n1").row("prolog", 1.0, 2.0).to_dict()
    assert PhaseRow.from_dict(good).phase == "prolog"
    for key, value in (("job_id", "1"), ("outcome", "great"), ("start", True), ("phase", "a b")):
        with pytest.raises(ValueError):
            PhaseRow.from_dict({**good, key: value})
