"""Issue 21.3: a job's marks count inside its own window (prolog to epilog); no single
row fails the report or dominates a cluster-wide figure, and the report says how many
were dropped or clipped."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer.phases.cluster import cluster_report
from bootseer.phases.reader import PhaseDataset
from bootseer.phases.report import job_report
from bootseer.phases.schema import PhaseRow
from bootseer.phases.writer import write_rows
from bootseer.store import Store
from tests.sitekeys import key_file

from .conftest import T0, node_rows


def hostile_job(store: Store, end: float) -> None:
    """Jobs 1-3 as usual; job 4's first_step ends at ``end``, and one more mark of it
    lies wholly after its epilog."""
    for job in (1, 2, 3):
        write_rows(store, node_rows(job, "n1"), source="epilog")
    rows = [
        dataclasses.replace(r, end=end) if r.phase == "first_step" else r
        for r in node_rows(4, "n1")
    ]
    late = dataclasses.replace(rows[2], phase="eval", start=end - 1, end=end)
    write_rows(store, [*rows, late], source="epilog")


@pytest.mark.parametrize("end", [99999999999.0, 9e9])
def test_one_mark_far_in_the_future_neither_fails_nor_skews_the_report(
    store: Store, end: float
) -> None:
    """The issue's two values: t=99999999999 made `report --since` fail with
    ArrowInvalid for everyone; t=9e9 made startup "2001192.0 h" and the share of
    allocated time in startup 513789423.89%."""
    hostile_job(store, end)
    cmd = [sys.executable, "-m", "bootseer.cli", "report", "--since", "3650d"]
    r = subprocess.run([*cmd, "--store", store.uri, "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    view = json.loads(r.stdout)
    assert view["runs"] == 4
    assert view["marks_dropped"] == 1 and view["marks_clipped"] == 1, view
    # Job 4's startup ends at its epilog's end (T0 + 101) at most; the others' at 16 s.
    assert view["startup_seconds_p90"] <= 101.0
    assert view["startup_share_of_allocated_time"] <= 1.01
    r = subprocess.run([*cmd, "--store", store.uri], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "1 mark(s) outside their job's window dropped, 1 clipped" in r.stdout


def test_a_job_report_keeps_its_marks_to_its_window(store: Store, dataset: PhaseDataset) -> None:
    hostile_job(store, 9e9)
    report = job_report(dataset, 4)
    assert (report.marks_dropped, report.marks_clipped) == (1, 1)
    run = report.runs[0]
    assert "eval" not in {p.phase for p in run.phases}
    view = cluster_report(dataset, since=T0 - 3600, until=T0 + 86400)
    assert view.runs == 4 and view.startup_p90 <= 101.0


def test_a_running_job_s_marks_end_by_now(store: Store, dataset: PhaseDataset) -> None:
    """No epilog yet: the window ends now, so a mark at t=9e9 is clipped to the read."""
    rows: list[PhaseRow] = [
        dataclasses.replace(r, end=9e9) if r.phase == "first_step" else r
        for r in node_rows(5, "n1")
        if r.phase != "epilog"
    ]
    write_rows(store, rows, source="prolog")
    report = job_report(dataset, 5)
    assert report.marks_clipped == 1
    first = next(p for p in report.runs[0].phases if p.phase == "first_step")
    assert first.max < 2e9 - T0  # seconds: up to now, not to t=9e9


def test_a_mark_named_like_a_hook_phase_is_not_taken(store: Store, tmp_path: Path) -> None:
    """The hooks' rows bound the window: a mark named `prolog` at t=1 or `epilog` at
    t=9e9 would stretch it, so the flush ignores such marks and says so."""
    import os
    from types import SimpleNamespace
    from typing import Any, cast

    from bootseer.phases.flush import flush
    from bootseer.phases.schema import JobMeta
    from bootseer.phases.spool import Spool

    spool = Spool(tmp_path, 9)
    spool.create(JobMeta(9, 0, "train", "ada", "ml", "n1", 1, 0), os.getuid(), os.getgid())
    lines = [
        {"ev": "start", "phase": "prolog", "t": 1.0},
        {"ev": "end", "phase": "prolog", "t": 2.0},
        {"ev": "end", "phase": "epilog", "t": 9e9},
        {"ev": "start", "phase": "ckpt_load", "t": T0 + 3},
        {"ev": "end", "phase": "ckpt_load", "t": T0 + 8},
    ]
    spool.marks_path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    cfg = cast(
        Any,
        SimpleNamespace(
            phases=SimpleNamespace(max_marks_bytes=1 << 20),
            site=SimpleNamespace(key_file=key_file(tmp_path)),  # root's flush seals
        ),
    )
    _, problems = flush(spool, store, "marks", cfg)
    assert problems == ["3 mark(s) named like a hook phase ignored (epilog, prolog)"]
    table = PhaseDataset(store).job(9)
    assert table["phase"].to_pylist() == ["ckpt_load"]
