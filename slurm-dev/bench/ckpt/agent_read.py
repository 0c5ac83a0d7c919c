"""The node agent's read of checkpoint units from a ``file://`` target: CPU, MB/s and the
page cache it leaves (issue 19).

In a job of two nodes or more, the node that owns a unit reads it from its target with
:meth:`bootseer.store.Store.read_range`, keeps it in its cache and hands it to the
others; its own mount then holds the unit's bytes again in its page cache. This reads
``--size-mib`` of 8 MiB units (written past the page cache, then dropped from it) with
``read_range`` of this tree and, with ``--before REV``, of that revision's (from a ``git
archive`` of its ``lib``), alternating, each in a fresh process; reported per run: the
reading process's CPU seconds per GiB, MiB/s, and the units' bytes left in the page
cache (``fincore``).

    $BOOTSEER_VENV/bin/python slurm-dev/bench/ckpt/agent_read.py --before main --reps 3 \\
        --out slurm-dev/bench/ckpt/results-agent-read-1GiB.json

Data under ``--state-dir`` is removed at the end, even on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOP = HERE.parents[2]
UNIT = 8 << 20
sys.path.insert(0, str(HERE))

from benchrun import add_state_and_out, in_fresh_state  # noqa: E402

READ = """
    import os, resource, subprocess, sys, time
    lib, root, count, unit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    sys.path.insert(0, lib)
    from bootseer.store import open_store
    store = open_store(f"file://{root}")
    paths = [f"{root}/u/{i}" for i in range(count)]
    for p in paths:  # cold, as on a node that did not write the checkpoint
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    r0, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for i in range(count):
        assert len(store.read_range(f"u/{i}", 0, unit)) == unit
    t, r1 = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF)
    cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", *paths],
        capture_output=True, text=True, check=True,
    ).stdout
    print(t, cpu, sum(int(x) for x in out.split()))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--before", default="", help="also read_range of this git revision")
    add_state_and_out(p, "agentr", "write the results here (JSON)")
    args = p.parse_args()
    state = args.state_dir
    return in_fresh_state(state, lambda: run(args, state))


def run(args: argparse.Namespace, state: Path) -> int:
    sys.path.insert(0, str(TOP / "lib"))
    from bootseer.store import open_store

    count = max(1, (args.size_mib << 20) // UNIT)
    (state / "target").mkdir(exist_ok=True)  # a store's root is the site's to make
    store = open_store(f"file://{state}/target")
    for i in range(count):
        store.write_bytes(f"u/{i}", os.urandom(UNIT), atomic=False, direct=True)
    libs = {"after": str(TOP / "lib")}
    if args.before:
        archive = subprocess.run(
            ["git", "-C", str(TOP), "archive", args.before, "lib"], capture_output=True, check=True
        ).stdout
        (state / "before").mkdir()
        subprocess.run(["tar", "-x", "-C", str(state / "before")], input=archive, check=True)
        libs = {"before": str(state / "before" / "lib"), **libs}
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in libs}
    gib = count * UNIT / (1 << 30)
    for rep in range(args.reps):
        for v in list(libs) if rep % 2 == 0 else list(libs)[::-1]:
            r = subprocess.run(
                [sys.executable, "-c", textwrap.dedent(READ), libs[v], f"{state}/target",
                 str(count), str(UNIT)],
                capture_output=True, text=True, timeout=3600,
            )  # fmt: skip
            if r.returncode != 0:
                raise SystemExit(f"{v}: {r.stderr.strip()[-400:]}")
            secs, cpu, cached = (float(x) for x in r.stdout.split())
            one = {
                "cpu_s_per_gib": cpu / gib,
                "mib_s": count * UNIT / (1 << 20) / secs,
                "cached_mib": cached / (1 << 20),
                "load1": os.getloadavg()[0],
            }
            runs[v].append(one)
            print(
                f"rep {rep} {v:6} " + " ".join(f"{k} {x:.2f}" for k, x in one.items()), flush=True
            )
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "bytes": count * UNIT,
        "unit_bytes": UNIT,
        "before": args.before,
        "commit": subprocess.run(
            ["git", "-C", str(TOP), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "median": {
            v: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for v, rs in runs.items()
        },
        "runs": runs,
    }
    print(json.dumps(results["median"], indent=1))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
