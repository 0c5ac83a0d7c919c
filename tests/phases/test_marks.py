from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import bootseer
from bootseer.phases import marks
from bootseer.phases.schema import JobMeta
from bootseer.phases.spool import Spool, rows_from_marks


@pytest.fixture
def spool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Spool:
    s = Spool(tmp_path, 3)
    s.create(JobMeta(3, node="n1"), os.getuid(), os.getgid())
    monkeypatch.setenv(marks.MARKS_ENV, str(s.marks_path))
    monkeypatch.setenv(marks.FLUSH_ENV, "0")
    monkeypatch.setattr(marks, "_fds", {})
    return s


def test_context_manager_marks_start_and_end(spool: Spool) -> None:
    with bootseer.phase("ckpt_load"):
        pass
    lines = [json.loads(x) for x in spool.marks_path.read_text().splitlines()]
    assert [(x["ev"], x["phase"]) for x in lines] == [("start", "ckpt_load"), ("end", "ckpt_load")]


def test_exception_marks_the_phase_failed_and_propagates(spool: Spool) -> None:
    with pytest.raises(ZeroDivisionError), bootseer.phase("framework_init"):
        1 / 0  # noqa: B018
    events, _ = spool.marks(1 << 20)
    (row,) = rows_from_marks(events, spool.meta(), final=True)
    assert row.outcome == "failed" and "ZeroDivisionError" in row.detail


def test_percent_n_in_the_path_is_this_node(spool: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    template = str(spool.marks_path).replace("/3/", "/%n/")
    (spool.path.parent / "n7").symlink_to(spool.path)
    monkeypatch.setenv(marks.MARKS_ENV, template)
    monkeypatch.setenv("SLURMD_NODENAME", "n7")
    assert marks.mark("end", "first_step")
    assert "first_step" in spool.marks_path.read_text()


def test_without_a_spool_a_mark_is_a_noop_said_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(marks.MARKS_ENV, raising=False)
    monkeypatch.setattr(marks, "_warned", False)
    assert marks.mark("start", "ckpt_load") is False
    assert marks.mark("end", "ckpt_load") is False
    assert capsys.readouterr().err.count("not recorded") == 1


def test_bad_names_raise_in_the_caller() -> None:
    with pytest.raises(ValueError, match="invalid phase name"):
        marks.mark("start", "no spaces please")


def test_cli_phase_run_records_the_command_outcome(spool: Spool) -> None:
    env = {**os.environ}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "bootseer.cli",
            "phase",
            "run",
            "deps_install",
            "--",
            "sh",
            "-c",
            "exit 3",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 3
    events, _ = spool.marks(1 << 20)
    (row,) = rows_from_marks(events, spool.meta(), final=True)
    assert row.outcome == "failed" and "exited with 3" in row.detail
    r = subprocess.run(
        [sys.executable, "-m", "bootseer.cli", "phase", "start", "bad name"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and "invalid phase name" in r.stderr


def test_import_bootseer_stays_cheap() -> None:
    # bootseer.phase loads the marks lazily: touch it, so the marks' own imports count.
    code = (
        "import sys, bootseer; bootseer.phase; assert 'bootseer.phases.marks' in sys.modules; "
        "print('pyarrow' in sys.modules, 'rich' in sys.modules, 'bootseer.config' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.split() == ["False", "False", "False"], r.stderr


def test_a_mark_loads_only_the_phase_command() -> None:
    # A job script's mark is a process start: the parser of the one command it names,
    # not all ten with what they import (issue 20: 0.07 -> 0.04 CPU-s a mark).
    env = {k: v for k, v in os.environ.items() if k != "BOOTSEER_PHASE_MARKS"}
    code = (
        "import sys; from bootseer.cli import main; sys.argv[1:] = ['phase', 'start', 'x']; "
        "main(); print(*sorted(m for m in sys.modules if m.endswith('_cmd')))"
    )
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["bootseer.cli.phase_cmd"]
    # Anything else is the whole parser: its usage and its errors name every command.
    r = subprocess.run(
        [sys.executable, "-m", "bootseer.cli", "phse"], env=env, capture_output=True, text=True
    )
    assert r.returncode == 2 and "'phase'" in r.stderr and "'uninstall'" in r.stderr


def test_marks_module_agrees_with_the_schema() -> None:
    from bootseer import stepapi
    from bootseer.cli import phase_cmd
    from bootseer.phases import schema

    assert marks.PHASE_NAME.pattern == schema.PHASE_NAME.pattern
    assert (marks.OUTCOMES, marks.STARTUP_END, marks.DETAIL_MAX) == (
        stepapi.OUTCOMES,
        schema.STARTUP_END,
        schema.DETAIL_MAX,
    )
    assert phase_cmd.OUTCOMES == stepapi.OUTCOMES  # bootseer phase end --outcome
