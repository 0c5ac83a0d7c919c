"""One definition of startup: the job report (rows) and the cluster view (columns) agree."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest

from bootseer.phases import startup
from bootseer.phases.cluster import run_table
from bootseer.phases.report import run_report
from bootseer.phases.schema import JobMeta, PhaseRow, to_table

from .conftest import T0, node_rows


def without(rows: list[PhaseRow], phase: str) -> list[PhaseRow]:
    return [r for r in rows if r.phase != phase]


def late_epilog_step(rows: list[PhaseRow]) -> list[PhaseRow]:
    # A teardown phase ending after everything else never ends startup.
    m = JobMeta(9, node="n1", node_count=2)
    return [*rows, m.row("deps_capture", T0 + 200, T0 + 300)]


RUNS = {
    "first_step on every node": node_rows(9, "n1", 2) + node_rows(9, "n2", 2, slow=3.0),
    "no first_step": without(node_rows(9, "n1", 2) + node_rows(9, "n2", 2, slow=3.0), "first_step"),
    "first_step on one node": node_rows(9, "n1", 2)
    + without(node_rows(9, "n2", 2, 9), "first_step"),
    "teardown last": late_epilog_step(node_rows(9, "n1", 2)),
    "prolog alone": [JobMeta(9, node="n1").row("prolog", T0, T0 + 2)],
}


@pytest.mark.parametrize("rows", RUNS.values(), ids=RUNS.keys())
def test_the_report_and_the_cluster_view_measure_one_startup(rows: list[PhaseRow]) -> None:
    report = run_report(list(rows))
    runs = run_table(to_table(rows))
    secs = startup.seconds_column(runs["allocated"], runs["startup_end"])
    assert report.startup == pytest.approx(pc.max(secs).as_py())
    end = startup.startup_end(rows)
    assert end is not None and report.startup_end == end.phase


def test_startup_ends_with_the_last_first_step_else_the_last_startup_phase() -> None:
    rows = RUNS["first_step on one node"]
    end = startup.startup_end(rows)
    assert end is not None and (end.phase, end.node) == ("first_step", "n1")
    end = startup.startup_end(RUNS["no first_step"])
    assert end is not None and (end.phase, end.node) == ("framework_init", "n2")
    assert startup.startup_end([JobMeta(9, node="n1").row("epilog", T0, T0 + 1)]) is None
