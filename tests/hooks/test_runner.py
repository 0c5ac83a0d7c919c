"""The hook runner with real threads and real deadlines (steps replaced by small ones)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer.config import SiteConfig
from bootseer.context import JobContext
from bootseer.errors import StepError
from bootseer.hooks import runner, steps
from bootseer.hooks.log import HookLog
from bootseer.hooks.steps import StepSpec
from bootseer.jobdir import JobDir
from bootseer.stepapi import StepCall, StepResult, StepRow


def ok_step(call: StepCall) -> StepResult:
    return StepResult(detail="fine", bytes=7, env={"BOOTSEER_OK": "1"})


def step_with_a_row(call: StepCall) -> StepResult:
    fill = StepRow("fill", 1.0, 2.0, "skipped", 9, "cut off", store_bytes=4, peer_bytes=5)
    return StepResult(detail="done", bytes=3, store_bytes=3, rows=[fill])


def failing_step(call: StepCall) -> StepResult:
    raise StepError("the store said no")


def crashing_step(call: StepCall) -> StepResult:
    missing: dict[str, StepResult] = {}
    return missing["missing"]


class Gate:
    """A slow step's: released by the test's end, ended once the step returned."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.ended = threading.Event()


# A step that outlives its deadline: it runs until its test lets it go, and says when it
# ended, so a test sees whether the runner waited for it, with no clock. Each test has
# its own gate: a step abandoned by one test cannot mark the next one's.
SLOW = Gate()


def slow_step(call: StepCall) -> StepResult:
    gate = SLOW
    gate.released.wait(60)
    gate.ended.set()
    return StepResult()


@pytest.fixture(autouse=True)
def slow() -> Iterator[None]:
    global SLOW
    SLOW = gate = Gate()
    yield
    gate.released.set()


@pytest.fixture
def ctx() -> JobContext:
    return JobContext(job_id=7, user="ada", uid=1000, gid=1000, node="n1", nodes=("n1",))


def run(
    tmp_path: Path, ctx: JobContext, table: dict[str, str], hooks: dict[str, object]
) -> runner.HookRun:
    specs = tuple(StepSpec(name, f"{__name__}:{fn}", lambda c: True) for name, fn in table.items())
    cfg = SiteConfig.from_mapping({"hooks": hooks})
    log = HookLog(tmp_path, "n1", 7, "prolog")
    saved = steps.PROLOG_STEPS
    steps.PROLOG_STEPS = specs
    try:
        return runner.run_steps("prolog", ctx, cfg, JobDir(tmp_path, 7).create(), log)
    finally:
        steps.PROLOG_STEPS = saved


def test_outcomes_of_ok_failed_and_crashed_steps(tmp_path: Path, ctx: JobContext) -> None:
    result = run(tmp_path, ctx, {"a": "ok_step", "b": "failing_step", "c": "crashing_step"}, {})
    assert [(o.step, o.outcome) for o in result.outcomes] == [
        ("a", "ok"),
        ("b", "failed"),
        ("c", "failed"),
    ]
    assert result.env == {"BOOTSEER_OK": "1"}
    assert result.outcomes[0].bytes == 7
    assert "the store said no" in result.outcomes[1].detail
    assert "KeyError" in result.outcomes[2].detail
    log = (tmp_path / "n1.log").read_text()
    assert "job=7 prolog step=b outcome=failed" in log
    assert result.failed


def test_the_notice_names_each_technique_not_set_up_and_why(
    tmp_path: Path, ctx: JobContext
) -> None:
    """One line for the job's stderr: each failed step as the option the job gave, the
    first words of why (never a second line), and nothing when every step is ok."""
    result = run(tmp_path, ctx, {"a": "ok_step", "b": "failing_step"}, {})
    notice = result.notice("n1")
    assert notice.startswith("bootseer on n1: not set up: --bootseer-b (failed: ")
    assert "the store said no" in notice and notice.endswith("the job runs without it")
    result.outcomes[1].detail = "line one\nline two " + "x" * 1000
    notice = result.notice("n1")
    assert "\n" not in notice and "line one line two" in notice
    assert len(notice) < runner.NOTICE_WHY + 100
    assert run(tmp_path, ctx, {"a": "ok_step"}, {}).notice("n1") == ""


def test_the_run_s_phase_rows_are_the_hook_s_each_step_s_and_the_steps_own(
    tmp_path: Path, ctx: JobContext
) -> None:
    result = run(tmp_path, ctx, {"a": "step_with_a_row", "b": "failing_step"}, {})
    hook, a, fill, b = result.phase_rows("prolog", began=None, now=1e10)
    assert (hook.phase, hook.outcome, hook.end) == ("prolog", "failed", 1e10)
    assert hook.start == min(o.start for o in result.outcomes)
    assert hook.detail == "steps: a, b; b failed"
    # Steps not in the table name their phase "<hook>_<step>".
    assert (a.phase, a.outcome, a.bytes, a.store_bytes, a.detail) == (
        "prolog_a",
        "ok",
        3,
        3,
        "done",
    )
    assert fill == StepRow("fill", 1.0, 2.0, "skipped", 9, "cut off", store_bytes=4, peer_bytes=5)
    assert (b.phase, b.outcome) == ("prolog_b", "failed")


def test_step_past_deadline_is_abandoned_without_waiting(tmp_path: Path, ctx: JobContext) -> None:
    result = run(
        tmp_path, ctx, {"slow": "slow_step", "fast": "ok_step"}, {"step_deadlines": {"slow": 0.3}}
    )
    assert not SLOW.ended.is_set()  # the runner returned while the step still ran
    assert {o.step: o.outcome for o in result.outcomes} == {"slow": "timed_out", "fast": "ok"}
    assert result.abandoned


def test_steps_end_where_the_hook_keeps_room_for_its_records(
    tmp_path: Path, ctx: JobContext
) -> None:
    specs = (StepSpec("slow", f"{__name__}:slow_step", lambda c: True),)
    cfg = SiteConfig.from_mapping({"hooks": {"prolog_deadline": 2.0}})
    assert cfg.records_reserve("prolog") == 0.4
    saved = steps.PROLOG_STEPS
    steps.PROLOG_STEPS = specs
    t0 = time.monotonic()
    try:
        result = runner.run_steps(
            "prolog",
            ctx,
            cfg,
            JobDir(tmp_path, 7).create(),
            HookLog(tmp_path, "n1", 7, "prolog"),
            until=t0 + 0.3,
        )
    finally:
        steps.PROLOG_STEPS = saved
    assert not SLOW.ended.is_set()  # the runner returned while the step still ran
    assert [o.outcome for o in result.outcomes] == ["timed_out"]
    # What was left of the 0.3 s when the step started (less, if this thread was kept
    # waiting before the runner began), never the step's own longer deadline.
    log = (tmp_path / "n1.log").read_text()
    allowed = re.search(r"outcome=timed_out deadline=([0-9.]+)s", log)
    assert allowed is not None and float(allowed.group(1)) <= 0.3


def test_a_step_s_promised_env_survives_its_failure(tmp_path: Path, ctx: JobContext) -> None:
    promise = {"BOOTSEER_PROMISED": "/tmp/env"}
    specs = (
        StepSpec("bad", f"{__name__}:failing_step", lambda c: True, env=lambda c: promise),
        StepSpec("slow", f"{__name__}:slow_step", lambda c: True, env=lambda c: {"B": "1"}),
    )
    cfg = SiteConfig.from_mapping({"hooks": {"step_deadlines": {"slow": 0.3}}})
    saved = steps.PROLOG_STEPS
    steps.PROLOG_STEPS = specs
    try:
        result = runner.run_steps(
            "prolog", ctx, cfg, JobDir(tmp_path, 7).create(), HookLog(tmp_path, "n1", 7, "prolog")
        )
    finally:
        steps.PROLOG_STEPS = saved
    assert [o.outcome for o in result.outcomes] == ["failed", "timed_out"]
    assert result.env == {"BOOTSEER_PROMISED": "/tmp/env", "B": "1"}


def test_the_deps_step_promises_its_prefix() -> None:
    from bootseer.options import Options, parse_deps

    (deps,) = [s for s in steps.PROLOG_STEPS if s.name == "deps"]
    job = JobContext(
        job_id=7,
        user="ada",
        uid=1000,
        gid=1000,
        node="n1",
        nodes=("n1",),
        options=Options(mode="on", deps=parse_deps("/tmp/ada/env")),
    )
    assert deps.env(job) == {"BOOTSEER_DEPS_PREFIX": "/tmp/ada/env"}


def test_failpoint_raises_in_the_named_step(tmp_path: Path, ctx: JobContext) -> None:
    result = run(tmp_path, ctx, {"a": "ok_step"}, {"failpoints": ["a:raise"]})
    assert result.outcomes[0].outcome == "failed"
    assert "failpoint a:raise" in result.outcomes[0].detail


def test_job_dir_env_refuses_foreign_names(tmp_path: Path) -> None:
    job = JobDir(tmp_path, 1).create()
    job.write_env({"BOOTSEER_IMAGE": "/x"})
    assert job.read_env() == {"BOOTSEER_IMAGE": "/x"}
    with pytest.raises(ValueError):
        job.write_env({"LD_PRELOAD": "/evil.so"})
    with pytest.raises(ValueError):
        job.write_env({"BOOTSEER_X": "a\nLD_PRELOAD=/evil.so"})
    assert job.read_env() == {"BOOTSEER_IMAGE": "/x"}
