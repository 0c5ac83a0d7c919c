"""What the metrics cost a hook: ``python -m bootseer.hooks prolog`` for a job that asked
for bootseer (no technique: the hook's own work only), with ``[metrics] textfile_dir``
set and unset, run alternately in one loop so both see the same machine; medians,
their difference and ratio, and the machine's load.

    python3 slurm-dev/bench/metrics/hooks.py [--runs 60]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOP = Path(__file__).resolve().parents[3]


def config(base: Path, metrics: bool) -> Path:
    path = base / ("on.toml" if metrics else "off.toml")
    (base / "store").mkdir(exist_ok=True)  # a store's root is the site's to make
    text = (
        f'[store]\nuri = "file://{base}/store"\n'
        f'[paths]\nrun_dir = "{base}/run"\ncache_dir = "{base}/cache"\nlog_dir = "{base}/log"\n'
        "[phases]\nbackground_flush = false\nsubmit_time = false\n"
    )
    if metrics:
        text += f'[metrics]\ntextfile_dir = "{base}/textfile"\n'
    path.write_text(text)
    return path


def once(hook: str, cfg: Path, job: int) -> float:
    env = {
        "BOOTSEER_CONFIG": str(cfg),
        "SPANK_BOOTSEER_MODE": "on",
        "SLURMD_NODENAME": "n1",
        "SLURM_JOB_ID": str(job),
        "SLURM_JOB_USER": "root",
        "SLURM_JOB_UID": "0",
        "SLURM_JOB_GID": "0",
        "SLURM_NODELIST": "n1",
    }
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bootseer.hooks", hook], env=env, check=True)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=60)
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bootseer-bench-metrics-"))
    try:
        variants = {"metrics off": config(base, False), "metrics on": config(base, True)}
        times: dict[str, list[float]] = {k: [] for k in variants}
        load = os.getloadavg()[0]
        job = 0
        for i in range(args.runs):
            order = list(variants.items())
            for name, cfg in order if i % 2 == 0 else reversed(order):
                job += 1
                # A prolog and its epilog: each adds its run to the hooks' file.
                times[name].append(once("prolog", cfg, job) + once("epilog", cfg, job))
        off = statistics.median(times["metrics off"])
        on = statistics.median(times["metrics on"])
        print(
            f"{args.runs} prolog+epilog pairs each, alternating, on {os.cpu_count()} cores, "
            f"load {load:.2f} -> {os.getloadavg()[0]:.2f}"
        )
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"  {name:12s} median {med * 1e3:7.1f} ms  (prolog + epilog)")
        print(f"  metrics add {(on - off) * 1e3:+.1f} ms a pair (x{on / off:.3f})")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
