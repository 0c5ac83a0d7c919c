from __future__ import annotations

import pytest

from bootseer.phases.schema import (
    COLUMNS,
    JobMeta,
    PhaseRow,
    arrow_schema,
    check_phase_name,
    from_table,
    phase_for_step,
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
    assert phase_for_step("prolog", "image") == "image_prefetch"
    assert phase_for_step("prolog", "deps") == "deps_restore"
    assert phase_for_step("epilog", "deps") == "deps_capture"
    assert phase_for_step("prolog", "gpucheck") == "prolog_gpucheck"


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
