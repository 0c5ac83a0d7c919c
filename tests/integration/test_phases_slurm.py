"""Phase records of real jobs on the 4-node slurm-dev cluster, read back by `bootseer report`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DevSlurm

pytestmark = pytest.mark.slurm

BIN = Path(sys.executable).parent
BOOTSEER = BIN / "bootseer"
PYTHON = BIN / "python3"

# Every task marks its phases; the third node's framework_init is slow (the straggler).
TASK = f"""
B={BOOTSEER}
$B phase run container_start -- sleep 0.2
{PYTHON} -c 'import bootseer, time
with bootseer.phase("ckpt_load"):
    time.sleep(0.3)'
if [ "$SLURMD_NODENAME" = "$SLOW_NODE" ]; then s=4; else s=0.2; fi
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


def test_resubmitted_job_shows_the_earlier_run_beside_it(cluster: DevSlurm) -> None:
    script = f"#!/bin/sh\nsrun -N2 -n2 {BOOTSEER} phase run ckpt_load -- sleep 0.1\n"
    first = cluster.sbatch("-N2", "-J", "phases-again", "--bootseer=on", script=script)
    assert cluster.wait(first) == "COMPLETED"
    second = cluster.sbatch("-N2", "-J", "phases-again", "--bootseer=on", script=script)
    assert cluster.wait(second) == "COMPLETED"
    data = cluster.report_json(second)
    assert [r["job_id"] for r in data["earlier_jobs"]] == [first]
    assert len(data["runs"]) == 1 and len(data["runs"][0]["nodes"]) == 2
    text = cluster.report(str(second)).stdout
    assert "Runs side by side" in text and "(earlier job)" in text


def test_job_without_records_is_said_plainly(cluster: DevSlurm) -> None:
    job = cluster.sbatch("-N1", script="#!/bin/sh\ntrue\n")  # no --bootseer
    assert cluster.wait(job) == "COMPLETED"
    r = cluster.report(str(job))
    assert r.returncode == 1
    assert f"No phase records for job {job}" in r.stderr


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
