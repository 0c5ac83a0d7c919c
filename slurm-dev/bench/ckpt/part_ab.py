"""Where a rank's part of a checkpoint costs the mount daemon CPU: two daemons, read by read.

``mount_bench.py`` takes the daemon's CPU from ``/proc`` in clock ticks (10 ms: a 256 MiB
part's 0.1 s is known to +-0.04 CPU-s/GiB). Here each variant (this tree's daemon, and
``--before REV``'s) gets a fresh mount per round, alternating, and each read of its file
(``mount_bench``'s workloads: a first and a second ``read_seq``, ``read_part_paced``,
``read_part``) is counted with ``perf stat -e task-clock`` on the daemon (every thread,
those a read starts included) and by the unit bytes it read from the targets
(``/proc/<pid>/io``): what the read-ahead fetched past what the reader took, and what an
open costs beyond its bytes, show apart.

    $BOOTSEER_VENV/bin/python slurm-dev/bench/ckpt/part_ab.py --before main --rounds 5 \\
        --out slurm-dev/bench/ckpt/results-part-ab-s16

Runs as root (FUSE, perf). Everything under ``--state-dir`` is removed at the end.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from mount_bench import (  # noqa: E402
    TOP,
    GiB,
    MiB,
    before_lib,
    drop_cache,
    mounted,
    run_one,
    settled,
    storage_read,
)
from write_bench import write_config  # noqa: E402

from benchrun import add_state_and_out, in_fresh_state, write_results  # noqa: E402

READS = ["read_seq", "read_seq", "read_part_paced", "read_part"]


def task_clock(pid: int, work: Any) -> tuple[Any, float]:
    """``work()``'s result and the CPU seconds process ``pid`` (all its threads) spent
    meanwhile, by ``perf stat``."""
    out = Path(f"/tmp/part_ab-{os.getpid()}.perf")
    perf = subprocess.Popen(
        ["perf", "stat", "-e", "task-clock", "-p", str(pid), "-o", str(out)],
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.5)  # attached
    try:
        got = work()
    finally:
        perf.send_signal(signal.SIGINT)
        perf.wait(timeout=30)
    m = re.search(r"([\d.,]+)\s+msec task-clock", out.read_text())
    out.unlink()
    if m is None:
        raise SystemExit(f"perf stat gave no task-clock for pid {pid}")
    return got, float(m.group(1).replace(",", "")) / 1000


def one_round(state: Path, variant: str, lib: str | None, size: int) -> list[dict[str, Any]]:
    rows = []
    with mounted(state, variant, lib) as (mp, pid):
        run_one(sys.executable, "write_seq", size, mp / "seq.bin")
        for i, w in enumerate(READS):
            for t in ("t0", "t1", "t2"):
                drop_cache(state / t)
            drop_cache(mp, sync=False)
            r0 = storage_read(pid)

            def read(w: str = w) -> tuple[float, int]:
                got = run_one(sys.executable, w, size, mp / "seq.bin")
                settled(pid)
                return got

            (secs, n), cpu = task_clock(pid, read)
            rows.append(
                {
                    "variant": variant,
                    "read": f"{w}#{READS[: i + 1].count(w)}",
                    "bytes": n,
                    "mb_s": n / secs / 1e6,
                    "cpu_s_per_gib": cpu / (n / GiB),
                    "fetched_per_byte": (storage_read(pid) - r0) / n,
                    "load1": os.getloadavg()[0],
                }
            )
            r = rows[-1]
            print(
                f"{variant:7} {r['read']:18} {r['mb_s']:7.0f} MB/s {r['cpu_s_per_gib']:.3f} "
                f"CPU-s/GiB fetched {r['fetched_per_byte']:.2f}x load1 {r['load1']:.1f}",
                flush=True,
            )
        (mp / "seq.bin").unlink()
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    for flag, default, what in (
        ("--size-mib", 1024, "the file's size"),
        ("--rounds", 5, "rounds, each a fresh mount of each variant"),
    ):
        p.add_argument(flag, type=int, default=default, help=what)
    p.add_argument("--before", default="main", help="the other daemon's git revision")
    add_state_and_out(p, "ckpt-ab", "write <out>.json and <out>.txt")
    args = p.parse_args()
    return in_fresh_state(args.state_dir, lambda: run(args, args.state_dir))


def run(args: argparse.Namespace, state: Path) -> int:
    os.environ["BOOTSEER_CONFIG"] = str(write_config(state))
    libs = {"before": before_lib(state, args.before), "after": None}
    size = args.size_mib * MiB
    rows: list[dict[str, Any]] = []
    for i in range(args.rounds):
        for variant in list(libs) if i % 2 == 0 else list(libs)[::-1]:
            rows += one_round(state, variant, libs[variant], size)
    commit = subprocess.run(
        ["git", "-C", str(TOP), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    lines = [
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC: {args.size_mib} MiB, 3 x file:// "
        f"on the local disk, {args.rounds} rounds alternating, medians (min-max); "
        f"after = {commit}, before = {args.before}",
        f"{'read':18} {'variant':7} {'MB/s':>6} {'CPU-s/GiB':>18} {'fetched':>8} {'load1':>9}",
    ]
    for read in dict.fromkeys(r["read"] for r in rows):
        for variant in libs:
            mine = [r for r in rows if r["read"] == read and r["variant"] == variant]
            cpu = [r["cpu_s_per_gib"] for r in mine]
            loads = [r["load1"] for r in mine]
            lines.append(
                f"{read:18} {variant:7} {statistics.median(r['mb_s'] for r in mine):6.0f} "
                f"{statistics.median(cpu):6.2f} ({min(cpu):.2f}-{max(cpu):.2f})"
                f" {statistics.median(r['fetched_per_byte'] for r in mine):7.2f}x"
                f" {min(loads):4.1f}-{max(loads):.1f}"
            )
    results = {"before": args.before, "after": commit, "rows": rows}
    write_results(args.out, results, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
