"""Phase records of real jobs on the 4-node slurm-dev cluster, read back by `bootseer report`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import DevSlurm

pytestmark = pytest.mark.slurm

BIN = Path(sys.executable).parent
BOOTSEER = BIN / "bootseer"
PYTHON = BIN / "python3"

# Every task marks its phases; the third node's framework_init is slow (the straggler):
# 8 s more than the others, so that it is the last node ready and more than 3 s behind the
# median however a loaded machine schedules the other nodes' dozen process starts.
TASK = f"""
B={BOOTSEER}
$B phase run container_start -- sleep 0.2
{PYTHON} -c 'import bootseer, time
with bootseer.phase("ckpt_load"):
    time.sleep(0.3)'
if [ "$SLURMD_NODENAME" = "$SLOW_NODE" ]; then s=8; else s=0.2; fi
$B phase run framework_init -- sleep $s
$B phase start first_step
sleep 0.2
$B phase end first_step
"""


def job_script(slow_node: str) -> str:
    return (
        f"#!/bin/sh\nexport SLOW_NODE={slow_node}\n"
        f"srun -N4 -n4 sh -c '{TASK.replace(chr(39), chr(39) + chr(92) + chr(39) + chr(39))}'\n"
    )


def test_four_node_job_phases_come_back_in_order_with_the_straggler(
    cluster: DevSlurm, image: Path, tmp_path: Path
) -> None:
    slow = cluster.nodes[2]
    job = cluster.sbatch(
        "-N4", "-J", "phases-demo", f"--bootseer-image={image}", script=job_script(slow)
    )
    assert cluster.wait(job, timeout=120) == "COMPLETED", cluster.output(job)
    data = cluster.report_json(job)
    (run,) = data["runs"]
    assert run["job_name"] == "phases-demo" and run["node_count"] == 4
    assert sorted(n["node"] for n in run["nodes"]) == sorted(cluster.nodes)
    for node in run["nodes"]:
        by = {p["phase"]: p for p in node["phases"]}
        want = [
            "prolog",
            "image_prefetch",
            "container_start",
            "ckpt_load",
            "framework_init",
            "first_step",
            "epilog",
        ]
        assert set(want) <= set(by), (node["node"], sorted(by))
        assert all(by[p]["outcome"] == "ok" for p in want), node
        # Prolog before the job's own phases, those in the order the script ran them,
        # the epilog after the first step.
        starts = [by[p]["start_offset_seconds"] for p in want[2:]]
        assert starts == sorted(starts), (node["node"], starts)
        assert by["prolog"]["start_offset_seconds"] <= by["image_prefetch"]["start_offset_seconds"]
        assert by["prolog"]["seconds"] <= starts[0] - by["prolog"]["start_offset_seconds"] + 0.01
        assert by["epilog"]["start_offset_seconds"] >= (
            by["first_step"]["start_offset_seconds"] + by["first_step"]["seconds"]
        )
    assert run["straggler"]["node"] == slow
    assert run["straggler"]["phase"] == "framework_init"
    assert run["straggler"]["behind_seconds"] > 3
    assert run["startup_end"] == "first_step"
    assert run["queue_wait_seconds"] is not None and run["queue_wait_seconds"] >= 0

    text = cluster.report(str(job))
    assert text.returncode == 0, text.stderr
    assert f"Straggler {slow}" in text.stdout and "framework_init" in text.stdout
    png = tmp_path / "timeline.png"
    r = cluster.report(str(job), "--plot", str(png))
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resubmitted_job_shows_the_earlier_run_of_the_same_script_beside_it(
    cluster: DevSlurm,
) -> None:
    """Runs side by side are runs of the same batch script (here read by sbatch from
    standard input: compared by content), never another script's job of the same name
    and user."""
    script = f"#!/bin/sh\nsrun -N2 -n2 {BOOTSEER} phase run ckpt_load -- sleep 0.1\n"
    first = cluster.sbatch("-N2", "-J", "phases-again", "--bootseer=on", script=script)
    assert cluster.wait(first) == "COMPLETED"
    other = cluster.sbatch("-N2", "-J", "phases-again", "--bootseer=on", script=script + "true\n")
    assert cluster.wait(other) == "COMPLETED"
    second = cluster.sbatch("-N2", "-J", "phases-again", "--bootseer=on", script=script)
    assert cluster.wait(second) == "COMPLETED"
    data = cluster.report_json(second)
    assert [r["job_id"] for r in data["earlier_jobs"]] == [first]
    assert data["runs"][0]["script"].startswith("sha256:")
    assert len(data["runs"]) == 1 and len(data["runs"][0]["nodes"]) == 2
    text = cluster.report(str(second)).stdout
    assert "Runs side by side" in text and "earlier" in text
    assert cluster.report_json(other)["earlier_jobs"] == []


def test_array_task_is_reported_by_its_array_id(cluster: DevSlurm) -> None:
    """``report 6_1`` is array task 6_1 (its own job id differs), not job 61."""
    script = f"#!/bin/sh\nsrun {BOOTSEER} phase run first_step -- true\n"
    array = cluster.sbatch("-N1", "--array=0-2", "--bootseer=on", script=script)
    tasks: dict[int, int] = {}  # task -> its job id, known once the task left PENDING
    deadline = time.monotonic() + 120
    while len(tasks) < 3 and time.monotonic() < deadline:
        r = subprocess.run(
            ["squeue", "-h", "-r", "-t", "all", "-j", str(array), "-o", "%A %K %T"],
            env=cluster.env,
            capture_output=True,
            text=True,
        )
        for job_id, task, state in (line.split() for line in r.stdout.splitlines() if line):
            if task.isdigit() and state != "PENDING":
                tasks[int(task)] = int(job_id)
        time.sleep(0.25)  # polls Slurm's answer, as DevSlurm.wait does
    assert sorted(tasks) == [0, 1, 2]
    for job in tasks.values():
        assert cluster.wait(job) == "COMPLETED", cluster.output(job)
    assert tasks[1] != int(f"{array}1")
    data = json.loads(cluster.report(f"{array}_1", "--json").stdout)
    (run,) = data["runs"]
    assert (run["job_id"], run["array_task"]) == (tasks[1], f"{array}_1")
    text = cluster.report(f"{array}_1").stdout
    assert f"Job {tasks[1]} (array task {array}_1)" in text
    r = cluster.report(f"{array}_7")
    assert r.returncode == 1 and f"No phase records for job {array}_7" in r.stderr


def test_a_failed_step_says_why_in_the_text_report(cluster: DevSlurm) -> None:
    """The image step fails (the file is no squashfs): the job starts the ordinary way,
    and the text report, not only --json, gives the step's reason."""
    bad = cluster.dir / "images" / "not-an-image.sqsh"
    bad.parent.mkdir(exist_ok=True)
    bad.write_bytes(b"this is no squashfs\n" * 100)
    bad.chmod(0o644)
    job = cluster.sbatch(
        "-N1",
        f"--bootseer-image={bad}",
        script=f"#!/bin/sh\nsrun {BOOTSEER} phase run first_step -- true\n",
    )
    assert cluster.wait(job) == "COMPLETED", cluster.output(job)
    (run,) = cluster.report_json(job)["runs"]
    (step,) = [p for n in run["nodes"] for p in n["phases"] if p["phase"] == "image_prefetch"]
    assert step["outcome"] == "failed" and step["detail"], step
    text = cluster.report(str(job)).stdout
    assert "Why phases failed" in text
    assert f"image_prefetch failed on {run['nodes'][0]['node']}: " in text
    assert step["detail"][:40] in " ".join(text.split())


def test_job_without_records_is_said_plainly(cluster: DevSlurm) -> None:
    """... and whether Slurm knows the job at all."""
    job = cluster.sbatch("-N1", script="#!/bin/sh\ntrue\n")  # no --bootseer
    assert cluster.wait(job) == "COMPLETED"
    r = cluster.report(str(job))
    assert r.returncode == 1
    assert f"No phase records for job {job}" in r.stderr
    assert f"Slurm knows job {job} (COMPLETED)" in r.stderr
    r = cluster.report("999999")
    assert r.returncode == 1 and "Slurm does not know job 999999" in r.stderr


def test_cluster_view_counts_the_runs(cluster: DevSlurm) -> None:
    job = cluster.sbatch(
        "-N2", "--bootseer=on", script=f"#!/bin/sh\nsrun -N2 -n2 {BOOTSEER} phase end first_step\n"
    )
    assert cluster.wait(job) == "COMPLETED"
    r = cluster.report("--since", "1h", "--json")
    assert r.returncode == 0, r.stderr
    view = json.loads(r.stdout)
    assert view["runs"] >= 1 and view["node_seconds_starting"] > 0
    assert any(b["bucket"] == "2-4 nodes" for b in view["by_size"])


def test_a_hostile_job_name_sets_nothing_and_is_shown_as_text(cluster: DevSlurm) -> None:
    """A job name that looks like scontrol's fields, with rich markup in it: the records
    keep the real submit time and account, and the report shows the name as it is."""
    name = "x SubmitTime=2001-01-01T00:00:00 Account=evil UserId=0(root) [/]"
    job = cluster.sbatch(
        "-N1",
        "-J",
        name,
        "--bootseer=on",
        script=f"#!/bin/sh\nsrun {BOOTSEER} phase run first_step -- true\n",
        user="mallory",
    )
    assert cluster.wait(job) == "COMPLETED", cluster.output(job)
    (run,) = cluster.report_json(job)["runs"]
    assert run["job_name"] == name
    assert run["account"] != "evil"
    assert run["submit_time"] is not None and not run["submit_time"].startswith("2001")
    text = subprocess.run(
        [str(BOOTSEER), "report", str(job)],
        env={**cluster.env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert text.returncode == 0, text.stderr
    assert repr(name) in text.stdout
