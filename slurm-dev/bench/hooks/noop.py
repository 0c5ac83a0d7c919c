"""What a job that did not ask for bootseer pays: the Prolog/Epilog's no-op path
against /bin/true, run alternately in the same loop (so both see the same machine).

    python3 slurm-dev/bench/hooks/noop.py [--runs 500]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path

TOP = Path(__file__).resolve().parents[3]
ENV = {  # what slurmd hands a Prolog for a job without --bootseer (no PATH)
    "SLURM_JOB_ID": "1",
    "SLURM_JOB_USER": "ada",
    "SLURM_JOB_UID": "1000",
    "SLURM_JOB_GID": "1000",
    "SLURMD_NODENAME": "n1",
    "SLURM_NODELIST": "n[1-4]",
}


def once(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=ENV, check=True)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=500)
    args = p.parse_args()
    cmds = {
        "/bin/true": ["/bin/true"],
        "prolog (no bootseer)": [str(TOP / "prolog" / "bootseer-prolog")],
        "epilog (no bootseer)": [str(TOP / "epilog" / "bootseer-epilog")],
    }
    times: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(args.runs):
        for name, cmd in cmds.items():
            times[name].append(once(cmd))
    base = statistics.median(times["/bin/true"])
    print(f"{args.runs} runs each, interleaved, on {os.cpu_count()} cores")
    for name, ts in times.items():
        med = statistics.median(ts)
        p90 = statistics.quantiles(ts, n=10)[-1]
        print(
            f"  {name:22s} median {med * 1e3:6.2f} ms  p90 {p90 * 1e3:6.2f} ms  "
            f"x{med / base:4.2f} of /bin/true  (+{(med - base) * 1e3:.2f} ms)"
        )


if __name__ == "__main__":
    main()
