from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from bootseer.phases.schema import JobMeta
from bootseer.phases.spool import MarkEvent, Spool, rows_from_marks
from bootseer.stepapi import Outcome

if TYPE_CHECKING:
    from bootseer.phases.marks import Event  # a type only: marks imports no typing

META = JobMeta(7, 0, "train", "ada", "ml", "n1", 2, 0)


def ev(event: Event, phase: str, t: float, task: str = "0.0", outcome: Outcome = "ok") -> MarkEvent:
    return MarkEvent(event, phase, t, task, outcome)


def test_ranks_on_a_node_become_one_row_spanning_them() -> None:
    events = [
        ev("start", "ckpt_load", 10, "0.0"),
        ev("start", "ckpt_load", 11, "0.1"),
        ev("end", "ckpt_load", 15, "0.1"),
        ev("end", "ckpt_load", 14, "0.0"),
    ]
    (row,) = rows_from_marks(events, META, final=True)
    assert (row.phase, row.start, row.end, row.outcome) == ("ckpt_load", 10, 15, "ok")
    assert row.detail.startswith("2 marks")


def test_one_failed_rank_fails_the_node_phase() -> None:
    events = [
        ev("start", "deps_install", 1, "0.0"),
        ev("start", "deps_install", 1, "0.1"),
        ev("end", "deps_install", 2, "0.0"),
        ev("end", "deps_install", 3, "0.1", "failed"),
    ]
    assert rows_from_marks(events, META, final=True)[0].outcome == "failed"


def test_end_without_start_is_a_point_and_open_start_waits_until_final() -> None:
    events = [ev("end", "first_step", 20), ev("start", "ckpt_load", 5)]
    early = rows_from_marks(events, META, final=False)
    assert [(r.phase, r.start, r.end) for r in early] == [("first_step", 20, 20)]
    final = rows_from_marks(events, META, final=True, now=30)
    unended = next(r for r in final if r.phase == "ckpt_load")
    assert (unended.start, unended.end, unended.outcome) == (5, 30, "failed")
    assert "never ended" in unended.detail


def test_spool_reads_marks_and_ignores_bad_lines(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 7)
    spool.create(META, os.getuid(), os.getgid())
    lines = [
        {"ev": "start", "phase": "ckpt_load", "t": 10.0, "task": "0.0"},
        {"ev": "end", "phase": "ckpt_load", "t": 12.0, "task": "0.0", "bytes": 5},
        {"ev": "start", "phase": "../../etc", "t": 10.0},
        {"ev": "end", "phase": "x", "t": "soon"},
        {"ev": "pause", "phase": "x", "t": 1.0},
    ]
    text = "".join(json.dumps(x) + "\n" for x in lines) + "not json\n"
    spool.marks_path.write_text(text)
    events, problems = spool.marks(1 << 20)
    assert [e.phase for e in events] == ["ckpt_load", "ckpt_load"]
    assert problems == ["4 unreadable mark line(s) ignored"]
    assert rows_from_marks(events, spool.meta(), final=True)[0].bytes == 5


def test_spool_caps_what_it_reads_and_does_not_follow_links(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 8)
    spool.create(META, os.getuid(), os.getgid())
    line = json.dumps({"ev": "end", "phase": "first_step", "t": 10.0}) + "\n"
    spool.marks_path.write_text(line * 100)
    events, problems = spool.marks(len(line) * 10 + 5)
    assert len(events) == 10 and "ignored" in problems[0]
    secret = tmp_path / "secret"
    secret.write_text(line)
    spool.marks_path.unlink()
    spool.marks_path.symlink_to(secret)
    events, problems = spool.marks(1 << 20)
    assert events == [] and "cannot read" in problems[0]


def test_create_replaces_a_leftover_spool_and_gives_the_marks_file_to_the_user(
    tmp_path: Path,
) -> None:
    spool = Spool(tmp_path, 9)
    spool.create(META, os.getuid(), os.getgid())
    spool.marks_path.write_text("old\n")
    spool.append_rows([META.row("prolog", 1, 2)])
    spool.create(META, os.getuid(), os.getgid())
    assert spool.marks_path.read_text() == "" and spool.hook_rows() == []
    st = spool.marks_path.stat()
    assert st.st_mode & 0o777 == 0o600 and st.st_uid == os.getuid()


def test_the_spools_dir_is_roots_alone_whatever_the_umask(tmp_path: Path) -> None:
    """The first prolog of a node makes ``<run_dir>/phases``: under a umask of 0 it was
    0777, and a user made the next job's spool path first (the prolog then failed)."""
    old = os.umask(0)
    try:
        Spool(tmp_path, 7).create(META, os.getuid(), os.getgid())
    finally:
        os.umask(old)
    assert (tmp_path / "phases").stat().st_mode & 0o022 == 0


def test_root_s_spool_files_are_root_s_alone(tmp_path: Path) -> None:
    """Another user on the node learns nothing of a running job from its spool (which
    job, its phases): with `public_phases = false` that was the last of it in the open
    (issue 21 item 6). The job's user still reaches her marks file by name."""
    spool = Spool(tmp_path / "run", 7)
    spool.create(META, os.getuid(), os.getgid())
    spool.append_rows([])
    assert stat.S_IMODE(spool.path.stat().st_mode) == 0o711
    for name in ("job.json", "rows.jsonl"):
        assert stat.S_IMODE((spool.path / name).stat().st_mode) == 0o600, name
    assert stat.S_IMODE(spool.marks_path.stat().st_mode) == 0o600
