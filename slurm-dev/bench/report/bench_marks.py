#!/usr/bin/env python3
"""Benchmark: the cost of one phase mark, and what phase records add to the prolog.

- Python API: ``bootseer.mark(...)`` and a ``with bootseer.phase(...)`` block (two marks),
  median over many calls, against an empty loop iteration.
- CLI: ``bootseer phase start NAME`` as a process, against ``python -c pass`` (the
  interpreter alone), median over a few runs.
- Prolog: ``record_hook_run("prolog", ...)`` in-process (spool, env file, spawning the
  detached flush), and the detached flush itself (pyarrow, one Parquet file).

    slurm-dev/bench/report/bench_marks.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bootseer
from bootseer.config import SiteConfig
from bootseer.context import JobContext
from bootseer.hooks.runner import HookRun, StepOutcome
from bootseer.jobdir import JobDir
from bootseer.phases import marks
from bootseer.phases.hooks import record_hook_run
from bootseer.phases.schema import JobMeta
from bootseer.phases.spool import Spool


def per_call(fn, n: int) -> float:  # type: ignore[no-untyped-def]
    """Median seconds per call over 5 batches of n."""
    batches = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        batches.append((time.perf_counter() - t) / n)
    return statistics.median(batches)


def per_process(cmd: list[str], n: int, env: dict[str, str]) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args()
    calls, procs = (2000, 5) if args.smoke else (20000, 21)
    tmp = Path(tempfile.mkdtemp(prefix="bench-marks-"))
    try:
        spool = Spool(tmp / "run", 1)
        spool.create(JobMeta(1, node="n1"), os.getuid(), os.getgid())
        os.environ[marks.MARKS_ENV] = str(spool.marks_path)
        os.environ[marks.FLUSH_ENV] = "0"

        def ctx_block() -> None:
            with bootseer.phase("ckpt_load"):
                pass

        empty = per_call(lambda: None, calls)
        one = per_call(lambda: bootseer.mark("start", "ckpt_load"), calls)
        block = per_call(ctx_block, calls)
        env = {**os.environ}
        py = per_process([sys.executable, "-c", "pass"], procs, env)
        cli = per_process(
            [sys.executable, "-m", "bootseer.cli", "phase", "start", "ckpt_load"], procs, env
        )
        script = Path(sys.executable).parent / "bootseer"
        cli_script = per_process([str(script), "phase", "start", "ckpt_load"], procs, env)

        # The prolog's share: spool + env file + spawning the detached flush.
        (tmp / "store").mkdir(exist_ok=True)  # a store's root is the site's to make
        cfg = SiteConfig.from_mapping(
            {
                "store": {"uri": f"file://{tmp}/store"},
                "paths": {"run_dir": str(tmp / "hook-run"), "log_dir": str(tmp / "log")},
                "phases": {"submit_time": False},
            }
        )
        os.environ["BOOTSEER_CONFIG"] = str(tmp / "site.toml")
        (tmp / "site.toml").write_text(f'[store]\nuri = "file://{tmp}/store"\n')
        now = time.time()
        run = HookRun([StepOutcome("image", "ok", now, now + 0.1, 1, "x")], {}, False)
        rows = run.phase_rows("prolog", began=now, now=now + 0.1)
        hook_times = []
        for i in range(procs):
            ctx = JobContext(
                job_id=1000 + i,
                user="root",
                uid=os.getuid(),
                gid=os.getgid(),
                node="n1",
                nodes=("n1", "n2"),
            )
            JobDir(cfg.paths.run_dir, ctx.job_id).create()
            t = time.perf_counter()
            record_hook_run("prolog", ctx, cfg, rows, print)
            hook_times.append(time.perf_counter() - t)
        flush_cmd = [
            sys.executable,
            "-m",
            "bootseer.phases.flush",
            "--prolog",
            str(Spool(cfg.paths.run_dir, 1000).path),
        ]
        flush = per_process(flush_cmd, max(3, procs // 4), env)
        time.sleep(2)  # let the detached flushes the loop started finish before cleanup
        print(
            json.dumps(
                {
                    "mark_python_us_median": round((one - empty) * 1e6, 2),
                    "with_phase_block_us_median": round((block - empty) * 1e6, 2),
                    "mark_cli_ms_median": round(cli_script * 1e3, 1),
                    "mark_cli_python_m_ms_median": round(cli * 1e3, 1),
                    "python_c_pass_ms_median": round(py * 1e3, 1),
                    "prolog_record_ms_median": round(statistics.median(hook_times) * 1e3, 2),
                    "detached_prolog_flush_ms_median": round(flush * 1e3, 1),
                },
                indent=1,
            )
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
