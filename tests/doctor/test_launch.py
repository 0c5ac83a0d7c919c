"""``bootseer doctor``'s ``launch`` check: a job's steps wait for every node's prolog
(issue 24, item 2), on slurm.conf files in a temporary directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from bootseer.doctor import Check
from bootseer.doctor.launch import check_step_launch
from bootseer.install.layout import Layout
from bootseer.install.slurmconf import slurm_conf_lines
from tests.doctor.test_doctor import make_node

DEADLINE: dict[str, object] = {"prolog_deadline": 120}


def check(tmp_path: Path, slurm: str) -> Check:
    return check_step_launch(make_node(tmp_path, slurm, hooks=DEADLINE))


def test_defer_batch_and_a_launch_wait_past_the_deadline_are_ok(tmp_path: Path) -> None:
    c = check(
        tmp_path, "PrologFlags=Contain,DeferBatch\nMessageTimeout=30\nBatchStartTimeout=130\n"
    )
    assert c.status == "ok", c
    assert "wait 160s" in c.detail and "120s deadline" in c.detail


def test_alloc_alone_is_reported_with_the_bound_srun_waits(tmp_path: Path) -> None:
    """What lost a node's tasks: Alloc, MessageTimeout=30, BatchStartTimeout unset."""
    c = check(tmp_path, "PrologFlags=Alloc\nMessageTimeout=30\n")
    assert c.status == "problem", c
    assert "lacks DeferBatch" in c.detail
    assert "only 40s (MessageTimeout+BatchStartTimeout)" in c.detail
    assert "120s deadline" in c.detail and "Socket timed out" in c.detail
    assert c.fix.startswith("PrologFlags=Alloc,DeferBatch")


def test_nohold_is_reported(tmp_path: Path) -> None:
    c = check(tmp_path, "PrologFlags=Alloc,NoHold,DeferBatch\nBatchStartTimeout=200\n")
    assert c.status == "problem", c
    assert "has NoHold" in c.detail
    assert c.fix == "PrologFlags=Alloc,DeferBatch"


def test_a_launch_wait_within_the_deadline_is_reported(tmp_path: Path) -> None:
    c = check(tmp_path, "PrologFlags=Alloc,DeferBatch\nMessageTimeout=30\n")
    assert c.status == "problem", c
    assert "MessageTimeout+BatchStartTimeout=40s" in c.detail
    assert "(BatchStartTimeout=10 (default))" in c.detail
    assert c.fix.startswith("BatchStartTimeout=110 ")  # 120 + 2 x 10 margin - 30


def test_without_alloc_it_is_left_to_the_prolog_check(tmp_path: Path) -> None:
    assert check(tmp_path, "PrologFlags=X11\n").status == "skip"


def test_a_timeout_that_is_no_number_is_reported(tmp_path: Path) -> None:
    c = check(tmp_path, "PrologFlags=Alloc\nMessageTimeout=soon\n")
    assert c.status == "problem" and "MessageTimeout=soon is not a number" in c.detail


@pytest.mark.parametrize(
    ("conf", "flags", "batch"),
    [
        ({}, "PrologFlags=Alloc,DeferBatch", "BatchStartTimeout=100"),
        ({"prologflags": "Contain,NoHold"}, "PrologFlags=Contain,Alloc,DeferBatch", None),
        ({"prologflags": "alloc,deferbatch", "batchstarttimeout": "300"}, None, None),
        ({"messagetimeout": "30"}, "PrologFlags=Alloc,DeferBatch", "BatchStartTimeout=80"),
    ],
)
def test_install_asks_for_what_the_check_wants(
    tmp_path: Path, conf: dict[str, str], flags: str | None, batch: str | None
) -> None:
    lines = slurm_conf_lines(Layout(), conf, 90)
    assert [x for x in lines if x.startswith("PrologFlags")] == ([flags] if flags else [])
    got = [x for x in lines if x.startswith("BatchStart")]
    if "batchstarttimeout" not in conf and "nohold" not in conf.get("prologflags", "").lower():
        assert got == [batch]
    # The lines added to the site's, the check passes (deadline 90 s here).
    merged = {**conf, **{k.lower(): v for k, _, v in (x.partition("=") for x in lines)}}
    text = "".join(
        f"{k}={v}\n"
        for k, v in merged.items()
        if k in ("prologflags", "messagetimeout", "batchstarttimeout")
    )
    node = make_node(tmp_path, text, hooks={"prolog_deadline": 90})
    assert check_step_launch(node).status == "ok", text
