"""record_hook_run as the hook runner calls it: prolog, job marks, epilog -> the store."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from bootseer.config import SiteConfig
from bootseer.context import JobContext
from bootseer.hooks.runner import HookRun, StepOutcome
from bootseer.jobdir import JobDir
from bootseer.phases import marks
from bootseer.phases.hooks import record_hook_run
from bootseer.phases.reader import PhaseDataset
from bootseer.phases.schema import from_table
from bootseer.phases.spool import Spool
from bootseer.stepapi import StepRow
from bootseer.store import open_store
from tests.sitekeys import KEYS, key_file


def test_prolog_marks_epilog_end_up_in_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "store").mkdir()  # the site makes the store's root, never bootseer
    cfg = SiteConfig.from_mapping(
        {
            "store": {"uri": f"file://{tmp_path}/store"},
            "paths": {"run_dir": str(tmp_path / "run"), "log_dir": str(tmp_path / "log")},
            "phases": {"background_flush": False, "submit_time": False},
            "site": {"key_file": str(key_file(tmp_path))},
        }
    )
    ctx = JobContext(
        job_id=77,
        user="ada",
        uid=os.getuid(),
        gid=os.getgid(),
        node="n1",
        nodes=("n1", "n2"),
        job_name="train",
        gpus_per_node=8,
    )
    job = JobDir(cfg.paths.run_dir, 77).create()
    import time

    t = time.time()
    prolog = HookRun(
        [
            StepOutcome("image", "ok", t, t + 0.5, 123, "image ready", 100, 23, "image_prefetch"),
            StepOutcome("deps", "timed_out", t, t + 1, 0, "deadline", phase="deps_restore"),
        ],
        {},
        False,
    )
    logged: list[str] = []
    env = record_hook_run(
        "prolog", ctx, cfg, prolog.phase_rows("prolog", began=None, now=t + 1), logged.append
    )  # for the env file
    monkeypatch.setenv(marks.MARKS_ENV, env[marks.MARKS_ENV])
    monkeypatch.setenv(marks.FLUSH_ENV, "0")
    monkeypatch.setattr(marks, "_fds", {})
    with marks.phase("ckpt_load"):
        pass
    marks.mark("start", "first_step")  # never ended: the job died
    fill = StepRow("image_background_fill", t + 1, t + 4, bytes=9, store_bytes=5, peer_bytes=4)
    epilog = HookRun(
        [StepOutcome("image", "skipped", t + 5, t + 5.1, phase="image_trace", extra=[fill])],
        {},
        False,
    )
    epilog_rows = epilog.phase_rows("epilog", began=t + 5, now=t + 6)
    record_hook_run("epilog", dataclasses.replace(ctx), cfg, epilog_rows, logged.append)
    assert not Spool(cfg.paths.run_dir, 77).path.exists()
    assert job.path.exists()  # the runner removes it after the records
    assert logged == []

    sealed = PhaseDataset(open_store(cfg.store.uri), keys=KEYS)  # root's files, sealed
    rows = {r.phase: r for r in from_table(sealed.job(77))}
    assert sealed.seals is not None and not sealed.seals.refused and sealed.seals.sealed
    assert set(rows) == {
        "prolog",
        "image_prefetch",
        "deps_restore",
        "ckpt_load",
        "first_step",
        "epilog",
        "image_trace",
        "image_background_fill",
    }
    assert rows["image_prefetch"].bytes == 123
    assert (rows["image_prefetch"].store_bytes, rows["image_prefetch"].peer_bytes) == (100, 23)
    assert rows["deps_restore"].outcome == "timed_out"
    assert rows["prolog"].outcome == "failed" and "deps timed_out" in rows["prolog"].detail
    assert rows["first_step"].outcome == "failed"
    assert rows["ckpt_load"].outcome == "ok"
    assert rows["image_trace"].outcome == "skipped"
    fill_row = rows["image_background_fill"]
    assert (fill_row.bytes, fill_row.store_bytes, fill_row.peer_bytes) == (9, 5, 4)
    assert all(
        r.gpus_per_node == 8 and r.node_count == 2 and r.job_name == "train" for r in rows.values()
    )
