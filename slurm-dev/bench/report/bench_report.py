#!/usr/bin/env python3
"""Benchmark: `bootseer report` over a year of phase records.

Generates ROWS phase rows (10 phases per job-node, jobs of 1..256 nodes spread over
365 days) into a file:// store, laid out as after daily compaction (one file per
day) plus the last day uncompacted (one small file per node and flush, as the hooks
leave them), then times the cluster view over the whole year and over 7 days, one
job's report (with its earlier jobs of the same script), and finding an array task's
job id in the records (``report ARRAYID_TASK`` for a job Slurm forgot). Medians of
REPEAT runs, in one process (warm page cache).

The files are sealed as root's flushes and compaction seal them, with a key of the
bench's own; ``--seals`` says how the reports read them: ``root`` checks every file's
seal (root's ``bootseer report``: each file read whole and its MAC computed), ``user``
only tells files without a seal from the footer (a user's), ``off`` as before seals.

    slurm-dev/bench/report/bench_report.py --smoke        # 50k rows, CI
    slurm-dev/bench/report/bench_report.py                # 1M rows, seals checked
    slurm-dev/bench/report/bench_report.py --seals user
    slurm-dev/bench/report/bench_report.py --rows 5000000 --cli
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bootseer.phases.cluster import cluster_report
from bootseer.phases.compact import write_day
from bootseer.phases.reader import PhaseDataset
from bootseer.phases.report import job_report
from bootseer.phases.schema import JobMeta, PhaseRow, to_table
from bootseer.phases.writer import write_rows
from bootseer.sitekey import SiteKeys
from bootseer.store import open_store

KEYS = SiteKeys([b"bench-report-site-key-0123456789abcdef"], source="bench")

PHASES = (  # name, typical seconds, starts after the previous one ends (else with prolog)
    ("prolog", 0.0),
    ("image_prefetch", 20.0),
    ("deps_restore", 8.0),
    ("ckpt_mount", 1.0),
    ("container_start", 6.0),
    ("deps_install", 30.0),
    ("ckpt_load", 40.0),
    ("framework_init", 15.0),
    ("first_step", 5.0),
    ("epilog", 3.0),
)
SIZES = (1, 1, 1, 1, 2, 2, 4, 4, 8, 8, 16, 32, 64, 128, 256)


def job_rows(rng: random.Random, job_id: int, t0: float, nodes: int) -> list[PhaseRow]:
    rows = []
    user = f"user{rng.randrange(200)}"
    name = f"train-{rng.randrange(500)}"
    submit = t0 - rng.expovariate(1 / 600)
    run_secs = rng.expovariate(1 / 20000) + 600
    straggler = rng.randrange(nodes)
    # One job in ten is an array task (array 500000 + job_id // 4, task job_id % 4);
    # every job has its batch script, one per user and name.
    array = (500_000 + job_id // 4, job_id % 4) if job_id % 10 == 0 else (None, None)
    for n in range(nodes):
        meta = JobMeta(
            job_id,
            0,
            name,
            user,
            "acct",
            f"n{n:05d}",
            nodes,
            8,
            submit,
            array_job_id=array[0],
            array_task_id=array[1],
            script=f"/home/{user}/{name}.sh",
        )
        t = t0 + rng.random() * 0.5
        slow = 1 + (rng.random() * 3 if n == straggler else rng.random() * 0.3)
        prolog_end = t
        for phase, typical in PHASES[1:4]:
            d = rng.expovariate(1 / typical) * slow
            rows.append(meta.row(phase, t, t + d, bytes=rng.randrange(1 << 30)))
            prolog_end = max(prolog_end, t + d)
        rows.append(meta.row("prolog", t, prolog_end + 0.05))
        t = prolog_end + 0.1
        for phase, typical in PHASES[4:9]:
            d = rng.expovariate(1 / typical) * slow
            rows.append(meta.row(phase, t, t + d))
            t += d
        rows.append(meta.row("epilog", t0 + run_secs, t0 + run_secs + 3))
    return rows


def generate(store_dir: Path, total: int, seed: int = 1) -> tuple[int, int]:
    """Write ``total`` rows; return (a wide job from mid-year, number of files)."""
    rng = random.Random(seed)
    store = open_store(f"file://{store_dir}")
    now = time.time()
    days = 365
    per_day = max(1, total // days)
    job_id, files, sample = 1000, 0, 1000
    for d in range(days, -1, -1):
        day_start = now - d * 86400 - (now % 86400)
        rows: list[PhaseRow] = []
        quota = per_day if d else min(per_day, total // 20)  # today: a small uncompacted tail
        while len(rows) < quota:
            job_id += 1
            nodes = min(rng.choice(SIZES), max(1, (quota - len(rows)) // len(PHASES)))
            t0 = day_start + rng.random() * 80000
            if d == 0:
                t0 = min(t0, now - 3600)
                for n_rows in _by_node(job_rows(rng, job_id, t0, nodes)):
                    write_rows(store, n_rows, source="epilog", keys=KEYS)
                    files += 1
                rows.append(None)  # type: ignore[arg-type]  # count only
                rows.extend([None] * (nodes * len(PHASES) - 1))  # type: ignore[list-item]
            else:
                rows.extend(job_rows(rng, job_id, t0, nodes))
                if d == days // 2 and nodes >= 16:
                    sample = job_id  # a wide job inside a compacted mid-year file
        if d:
            day = time.strftime("%Y-%m-%d", time.gmtime(day_start))
            write_day(store, day, to_table(rows), keys=KEYS)
            files += 1
    return sample, files


def _by_node(rows: list[PhaseRow]) -> list[list[PhaseRow]]:
    out: dict[str, list[PhaseRow]] = {}
    for r in rows:
        out.setdefault(r.node, []).append(r)
    return list(out.values())


CPU: dict[str, float] = {}


def timed(fn, repeat: int, name: str = "") -> tuple[float, object]:  # type: ignore[no-untyped-def]
    """Median wall seconds (and, in CPU[name], median CPU seconds of this process: the
    figure a shared, loaded machine disturbs least)."""
    times, cpus, result = [], [], None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        result = fn()
        times.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    if name:
        CPU[name] = round(statistics.median(cpus), 3)
    return statistics.median(times), result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--smoke", action="store_true", help="50k rows, for CI")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dir", type=Path, help="keep the generated store here (default: a temp dir)")
    p.add_argument("--cli", action="store_true", help="also time the `bootseer report` command")
    p.add_argument(
        "--seals",
        choices=("root", "user", "off"),
        default="root",
        help="check every seal (root's report), tell unsealed files (a user's), or neither",
    )
    args = p.parse_args()
    rows = 50_000 if args.smoke else args.rows
    base = args.dir or Path(tempfile.mkdtemp(prefix="bench-report-"))
    store_dir = base / "store"
    try:
        t = time.perf_counter()
        if not (store_dir / "phases").exists():
            sample, files = generate(store_dir, rows)
            (base / "sample").write_text(f"{sample} {files}")
        sample, files = (int(x) for x in (base / "sample").read_text().split())
        gen = time.perf_counter() - t
        store = open_store(f"file://{store_dir}")
        ds = PhaseDataset(
            store, keys=KEYS if args.seals == "root" else None, check_seals=args.seals != "off"
        )
        now = time.time()
        year, view = timed(
            lambda: cluster_report(ds, since=now - 366 * 86400),
            args.repeat,
            "cluster_year_cpu_seconds_median",
        )
        week, _ = timed(
            lambda: cluster_report(ds, since=now - 7 * 86400),
            args.repeat,
            "cluster_7d_cpu_seconds_median",
        )
        one, job = timed(lambda: job_report(ds, sample), args.repeat, "one_job_cpu_seconds_median")
        # `report ARRAY_TASK` for a task Slurm forgot: a scan of the array columns.
        task_of = (500_000 + 2000 // 4, 2000 % 4)  # job 2000's (the 1000th job's) task
        arr, found = timed(
            lambda: ds.array_task(*task_of), args.repeat, "array_task_cpu_seconds_median"
        )
        result = {
            "rows": view.rows,  # type: ignore[attr-defined]
            "runs": view.runs,  # type: ignore[attr-defined]
            "files": files,
            "generate_seconds": round(gen, 2),
            "cluster_year_seconds_median": round(year, 3),
            "cluster_7d_seconds_median": round(week, 3),
            "one_job_seconds_median": round(one, 3),
            "one_job_nodes": len(job.runs[0].nodes) if job.runs else 0,  # type: ignore[attr-defined]
            "one_job_earlier_jobs": len(job.earlier),  # type: ignore[attr-defined]
            "array_task_seconds_median": round(arr, 3),
            "array_task_found": found == 2000,
            "seals": args.seals,
            "files_refused": 0 if ds.seals is None else len(ds.seals.refused),
            "store_bytes": sum(i.size for i in store.list("phases", recursive=True)),
            **CPU,
            "load_average_1min": round(os.getloadavg()[0], 1),
            "cpus": os.cpu_count(),
        }
        if args.cli:
            cmd = [
                sys.executable,
                "-m",
                "bootseer.cli",
                "report",
                "--since",
                "366d",
                "--store",
                f"file://{store_dir}",
                "--json",
            ]
            cli, _ = timed(
                lambda: subprocess.run(cmd, check=True, capture_output=True), args.repeat
            )
            result["cli_year_seconds_median"] = round(cli, 3)
        print(json.dumps(result, indent=1))
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
