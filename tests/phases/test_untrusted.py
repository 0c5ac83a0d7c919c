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


# What a terminal obeys rather than shows: a clipboard write (OSC 52), a window title,
# clearing the screen, a C1 CSI, a newline that starts a report line of its own, and a
# right-to-left override that shows text in another order.
TERMINAL_CONTROLS = (
    "\x1b]52;c;cHduZWQ=\x07",
    "\x1b]0;pwned\x07",
    "\x1b[2J",
    "\x9b31m",
    "\nStartup 0.01 s",
    "\u202e",
)


def test_terminal_controls_in_user_strings_are_shown_not_obeyed(
    store: Store, dataset: PhaseDataset
) -> None:
    """A mark's detail (``bootseer phase end X --outcome failed --detail ...``) and the
    script's path are the user's, and the report is read by others (root, an admin, a
    colleague): rich escapes markup but passes ESC through, so each of these reached the
    reader's terminal as it was."""
    from rich.console import Console

    from bootseer.phases.schema import JobMeta

    hostile = "".join(TERMINAL_CONTROLS)
    for node in ("n1", "n2"):
        rows = node_rows(51, node, nodes=2, name=hostile, script=f"/home/ada/{hostile}.sh")
        m = JobMeta(51, 0, hostile, "ada", "ml", node, 2, 8, rows[0].start - 30)
        rows.append(
            m.row("ckpt_verify", rows[0].start + 3, rows[0].start + 4, "failed", 0, hostile)
        )
        write_rows(store, rows, source="epilog")
    out = io.StringIO()
    # A terminal: rich writes its own styles, never the user's controls.
    console = Console(file=out, width=200, force_terminal=True, color_system="truecolor")
    render_job(job_report(dataset, 51), console)
    text = out.getvalue()
    for control in TERMINAL_CONTROLS:
        assert control not in text, repr(control)
    assert "\x9b" not in text and "\u202e" not in text and "\x07" not in text
    assert "\x1b]" not in text and "\x1b[2J" not in text
    assert "\\x1b]52;c;cHduZWQ=\\x07" in text  # shown, as Python writes it
    assert "Why phases failed" in text and "/home/ada/" in text
