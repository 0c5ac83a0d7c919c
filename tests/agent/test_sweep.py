"""The sweep's rules without Slurm: squeue's answer read strictly, Slurm asked at most
once per interval and only when some job's state is on the node, a job dir that changed
since it was listed kept, nothing swept when squeue fails. (tests/agent/test_sweep_slurm.py
asks real Slurm.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bootseer.agent.sweep import Sweeper, clean, list_leftovers
from bootseer.config import SiteConfig
from bootseer.errors import ConfigError
from bootseer.slurmjobs import NodeJobs, SlurmUnavailable, node_jobs, parse_jobs


def fake_squeue(tmp_path: Path, body: str) -> Path:
    """A stand-in squeue that records each call in ``calls``."""
    script = tmp_path / "squeue"
    script.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/calls\n{body}\n')
    script.chmod(0o755)
    return script


def calls(tmp_path: Path) -> list[str]:
    try:
        return (tmp_path / "calls").read_text().splitlines()
    except FileNotFoundError:
        return []


def test_states_before_the_end_and_unknown_ones_count_as_running() -> None:
    jobs = NodeJobs(
        parse_jobs(
            "1 CONFIGURING\n2 RUNNING\n3 COMPLETING\n4 SUSPENDED\n"
            "5 COMPLETED\n6 CANCELLED\n7 NODE_FAIL\n8 SOMETHING_NEW\n"
        )
    )
    assert sorted(jobs.running) == [1, 2, 3, 4, 8]


@pytest.mark.parametrize(
    "text", ["squeue: error: Invalid node name\n", "12 RUNNING extra\n", "x RUNNING\n"]
)
def test_a_line_of_another_shape_means_slurm_did_not_answer(text: str) -> None:
    with pytest.raises(SlurmUnavailable):
        parse_jobs(text)


def test_squeue_asked_for_this_node_only_and_its_failures(tmp_path: Path) -> None:
    ok = fake_squeue(tmp_path, 'echo "4711 RUNNING"')
    assert node_jobs("n7", ok).states == {4711: "RUNNING"}
    assert "--nodelist=n7" in calls(tmp_path)[0] and "--states=all" in calls(tmp_path)[0]
    with pytest.raises(SlurmUnavailable, match=r"exit 1.*controller"):
        node_jobs(
            "n7", fake_squeue(tmp_path, "echo 'Unable to contact slurm controller' >&2; exit 1")
        )
    with pytest.raises(SlurmUnavailable, match="cannot run"):
        node_jobs("n7", tmp_path / "nowhere")
    with pytest.raises(SlurmUnavailable, match="no answer within"):
        node_jobs("n7", fake_squeue(tmp_path, "exec sleep 30"), timeout=0.5)


def sweeper(tmp_path: Path, squeue: Path, interval: float = 3600) -> tuple[Sweeper, list[str]]:
    lines: list[str] = []
    s = Sweeper(
        "n7", tmp_path / "run", squeue, interval, list, lambda j: f"released {j}", lines.append
    )
    return s, lines


def test_slurm_is_asked_only_with_something_on_the_node_and_at_most_once_per_interval(
    tmp_path: Path,
) -> None:
    squeue = fake_squeue(tmp_path, 'echo "5 RUNNING"')
    s, lines = sweeper(tmp_path, squeue)
    assert s.maybe() == [] and calls(tmp_path) == []  # nothing on the node: not asked
    for job in (5, 6):
        (tmp_path / "run" / "jobs" / str(job)).mkdir(parents=True)
    assert s.maybe() == [6]
    assert not (tmp_path / "run" / "jobs" / "6").exists()
    assert (tmp_path / "run" / "jobs" / "5").is_dir()
    (tmp_path / "run" / "jobs" / "7").mkdir()
    assert s.maybe() == [] and len(calls(tmp_path)) == 1  # not due again within the hour
    assert any("sweep: job=6 (Slurm does not run it on n7" in line for line in lines), lines
    assert (s.swept, s.unanswered) == (1, 0)  # the agent's metrics


def test_nothing_is_swept_when_squeue_fails(tmp_path: Path) -> None:
    s, lines = sweeper(tmp_path, fake_squeue(tmp_path, "exit 1"))
    (tmp_path / "run" / "jobs" / "6").mkdir(parents=True)
    assert s.maybe() == []
    assert (tmp_path / "run" / "jobs" / "6").is_dir()
    assert "sweep: cannot ask Slurm" in lines[0] and "[6] kept" in lines[0]
    assert (s.swept, s.unanswered) == (0, 1)


def test_a_job_dir_that_changed_since_it_was_listed_is_kept(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "jobs" / "6").mkdir(parents=True)
    listed = list_leftovers(run)
    os.utime(run / "jobs" / "6")  # a prolog of job 6 again (requeued onto this node)
    (run / "jobs" / "6" / "env").write_text("")
    assert clean(6, run, listed).startswith("kept")
    assert (run / "jobs" / "6").is_dir()
    assert "job dir removed" in clean(6, run, list_leftovers(run))


def test_the_interval_is_off_or_at_least_a_second() -> None:
    with pytest.raises(ConfigError, match="sweep_interval"):
        SiteConfig.from_mapping({"hooks": {"sweep_interval": 0.5}})
    assert SiteConfig.from_mapping({"hooks": {"sweep_interval": 0}}).hooks.sweep_interval == 0
