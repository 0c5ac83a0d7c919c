from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bootseer.phases.cluster import cluster_report
from bootseer.phases.reader import PhaseDataset
from bootseer.phases.report import job_report
from bootseer.phases.writer import write_rows
from bootseer.store import Store

from .conftest import T0, node_rows


def write_job(
    store: Store, job_id: int, slow_node: str | None = None, slow: float = 0.0, **kw: object
) -> None:
    for node in ("n1", "n2", "n3", "n4"):
        rows = node_rows(job_id, node, slow=slow if node == slow_node else 0.0, **kw)  # type: ignore[arg-type]
        write_rows(store, rows, source="epilog")


def test_straggler_is_named_with_its_phase(store: Store, dataset: PhaseDataset) -> None:
    write_job(store, 10, slow_node="n3", slow=6.0)
    (run,) = job_report(dataset, 10).runs
    assert run.straggler is not None
    assert (run.straggler.node, run.straggler.phase) == ("n3", "ckpt_load")
    assert run.straggler.behind == pytest.approx(6.0)
    assert run.straggler.phase_seconds == pytest.approx(11.0)
    assert run.startup == pytest.approx(16.0)  # allocation to the last first_step end
    assert run.queue_wait == pytest.approx(30.0)
    ckpt = run.phase("ckpt_load")
    assert ckpt is not None
    assert (ckpt.min, ckpt.median, ckpt.max, ckpt.slowest) == (5.0, 5.0, 11.0, "n3")
    assert [p.phase for p in run.phases][:3] == ["prolog", "image_prefetch", "container_start"]


def test_restarts_and_resubmissions_are_side_by_side(store: Store, dataset: PhaseDataset) -> None:
    """Runs side by side: restarts, and earlier jobs from the same batch script (whatever
    their name), never another script's job that has the same name and user."""
    write_job(store, 20, t0=T0)
    write_job(store, 21, restart=0, t0=T0 + 1000)
    write_job(store, 21, restart=1, t0=T0 + 2000)
    write_job(store, 22, t0=T0 + 500, script="/home/ada/eval.sh")  # also named "train"
    write_job(store, 23, name="renamed", t0=T0 + 600)
    write_job(store, 24, t0=T0 + 700, script="")  # sbatch < script: Slurm names none
    report = job_report(dataset, 21)
    assert [(r.job_id, r.restart_count) for r in report.runs] == [(21, 0), (21, 1)]
    assert [r.job_id for r in report.earlier] == [20, 23]
    assert job_report(dataset, 24).earlier == []  # its own restarts only
    data: Any = report.to_json()
    assert data["found"] and len(data["runs"][1]["nodes"]) == 4
    r = run_cli("report", "21", "--store", store.uri)
    assert r.returncode == 0, r.stderr
    side = r.stdout[r.stdout.index("Runs side by side") :]
    # Two-line column heads (the run, then whose): once printed as a literal "\n".
    assert "\\n" not in side and "earlier" in side and "this job" in side


def test_cluster_view_sums_startup_and_buckets_by_size(store: Store, dataset: PhaseDataset) -> None:
    write_job(store, 30)
    for node in ("n1",):
        write_rows(store, node_rows(31, node, nodes=1, t0=T0 + 50), source="epilog")
    view = cluster_report(dataset, since=T0 - 3600, until=T0 + 86400)
    assert (view.jobs, view.runs) == (2, 2)
    assert view.startup_seconds == pytest.approx(32.0)
    assert view.node_seconds == pytest.approx(16 * 4 + 16)
    assert view.gpu_seconds == pytest.approx((16 * 4 + 16) * 8)
    # allocated: the epilog starts 100 s after allocation
    assert view.share == pytest.approx(80 / 500)
    assert [(b.label, b.runs) for b in view.buckets] == [("1 node", 1), ("2-4 nodes", 1)]
    assert [p.phase for p in view.top_phases[:2]] == ["first_step", "ckpt_load"]
    assert json.dumps(view.to_json())


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bootseer.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_report_of_a_job_without_records_says_so_plainly(store: Store) -> None:
    r = run_cli("report", "12345", "--store", store.uri)
    assert r.returncode == 1
    assert "No phase records for job 12345" in r.stderr
    r = run_cli("report", "12345", "--json", "--store", store.uri)
    assert r.returncode == 1 and json.loads(r.stdout)["found"] is False


def test_report_renders_text_json_and_pictures(store: Store, tmp_path: Path) -> None:
    write_job(store, 40, slow_node="n2", slow=3.0)
    r = run_cli("report", "40", "--store", store.uri)
    assert r.returncode == 0, r.stderr
    assert "Straggler n2" in r.stdout and "Timeline" in r.stdout and "ckpt_load" in r.stdout
    for name in ("t.png", "t.svg"):
        r = run_cli("report", "40", "--store", store.uri, "--plot", str(tmp_path / name))
        assert r.returncode == 0, r.stderr
    assert (tmp_path / "t.png").read_bytes().startswith(b"\x89PNG")
    assert b"<svg" in (tmp_path / "t.svg").read_bytes()[:500]
    r = run_cli(
        "report", "--since", "3650d", "--store", store.uri, "--plot", str(tmp_path / "c.png")
    )
    assert r.returncode == 0, r.stderr
    assert "share of allocated time" in r.stdout
    r = run_cli("report", "40", "--store", store.uri, "--plot", str(tmp_path / "t.gif"))
    assert r.returncode == 1 and "want a file ending in" in r.stderr


def test_files_from_before_the_array_and_script_columns_still_read(
    store: Store, dataset: PhaseDataset, warnings_seen: list[str]
) -> None:
    """Records written before ``array_job_id``, ``array_task_id`` and ``script`` existed
    read as no array task and no script: reported alone, never beside another job."""
    from bootseer.phases.schema import to_table
    from bootseer.phases.writer import parquet_bytes

    old = to_table(node_rows(60, "n1")).drop_columns(["array_job_id", "array_task_id", "script"])
    store.write_bytes(
        "phases/day=2026-09-21/job=60/n1-r0-epilog-0123456789ab.parquet", parquet_bytes(old)
    )
    write_job(store, 61, t0=T0 + 1000)  # a newer job with a script (another name too)
    write_rows(  # an array task's records
        store,
        [
            r.__class__(**{**r.to_dict(), "array_job_id": 59, "array_task_id": 2})
            for r in node_rows(62, "n1", t0=T0 + 2000)
        ],
        source="epilog",
    )
    (run,) = job_report(dataset, 60).runs
    assert (run.script, run.array_task) == ("", None)
    assert job_report(dataset, 60).earlier == []
    assert [r.job_id for r in job_report(dataset, 61).earlier] == []  # job 60: no script
    assert dataset.array_task(59, 2) == 62 and dataset.array_task(60, 0) is None
    assert job_report(dataset, 62).runs[0].array_task == "59_2"
    assert warnings_seen == []
