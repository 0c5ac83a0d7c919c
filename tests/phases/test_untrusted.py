"""What a job's user controls (its name, its account where the site does not check them)
reaches the records and the report as data, never as structure."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from bootseer.phases.flush import slurm_job_info
from bootseer.phases.reader import PhaseDataset
from bootseer.phases.render import render_job
from bootseer.phases.report import job_report
from bootseer.phases.writer import write_rows
from bootseer.store import Store

from .conftest import node_rows

SUBMITTED = 1_790_000_000
HOSTILE_NAME = "x SubmitTime=2001-01-01T00:00:00 Account=evil UserId=0(root) JobName=y"


@pytest.fixture
def fake_slurm(tmp_path: Path) -> Path:
    """One program that answers both ways Slurm can be asked about job 77: the text line
    of ``scontrol -o show job`` and the JSON of ``squeue --json`` (with another job)."""
    text = (
        f"JobId=77 JobName={HOSTILE_NAME} UserId=ada(1000) GroupId=ada(1000) "
        "Account=ml QOS=normal JobState=RUNNING SubmitTime="
        + time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(SUBMITTED))
        + " Partition=debug"
    )
    jobs = [
        {"job_id": 76, "name": "other", "account": "other", "submit_time": 5},
        {"job_id": 77, "name": HOSTILE_NAME, "account": "ml", "submit_time": SUBMITTED},
    ]
    prog = tmp_path / "slurm"
    prog.write_text('#!/bin/sh\ncase "$*" in *--json*) cat "$0.json";; *) cat "$0.txt";; esac\n')
    prog.chmod(0o755)
    Path(f"{prog}.json").write_text(json.dumps({"meta": {}, "errors": [], "jobs": jobs}))
    Path(f"{prog}.txt").write_text(text + "\n")
    return prog


def test_slurm_job_info_takes_nothing_from_inside_the_job_name(fake_slurm: Path) -> None:
    info = slurm_job_info(77, fake_slurm, timeout=10)
    assert info == {"submit_time": float(SUBMITTED), "job_name": HOSTILE_NAME, "account": "ml"}


def test_slurm_job_info_is_empty_when_slurm_says_nothing_usable(tmp_path: Path) -> None:
    prog = tmp_path / "squeue"
    for out in ("not json", "[]", '{"jobs": [{"job_id": 78}]}', "[" * 100_000):
        prog.write_text(f"#!/bin/sh\ncat <<'EOF'\n{out}\nEOF\n")
        prog.chmod(0o755)
        assert slurm_job_info(77, prog, timeout=10) == {}


@pytest.mark.parametrize(
    "hostile", ["[/]", "[bold red]evil[/bold red]", "[link=http://x]y[/link]", "a\\"]
)
def test_markup_in_user_strings_is_shown_as_text(
    store: Store, dataset: PhaseDataset, hostile: str
) -> None:
    from rich.console import Console

    for node in ("n1", "n2"):
        rows = node_rows(50, node, nodes=2, name=hostile)
        write_rows(store, rows, source="epilog")
    out = io.StringIO()
    console = Console(file=out, width=160, color_system=None, highlight=False)
    render_job(job_report(dataset, 50), console)
    assert repr(hostile) in out.getvalue()
