"""`uv pip install` of a requirements file from a warm local cache: the baseline a
restore should beat (issue 19).

Warms ``WORK/uv-cache`` with one install, then times ``--runs`` installs into fresh
venvs (the venv's creation is not timed), with uv's default link mode (hardlinks from
the cache when it is on the same file system) and with ``--link-mode copy`` (what a
node whose cache is elsewhere, or a fresh node-local disk, pays). Wall and CPU seconds
(uv is a child: RUSAGE_CHILDREN), medians, into ``--json``.

    python3 uv_warm.py REQUIREMENTS WORK --runs 3 --json uv.json -- --find-links /opt/wheels
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("requirements", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--uv", default=shutil.which("uv") or "uv")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--json", type=Path)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    args.uv_args = argv[cut + 1 :]  # after --: index options for uv
    work = args.work.resolve()
    env = {**os.environ, "UV_CACHE_DIR": str(work / "uv-cache"), "UV_NO_PROGRESS": "1"}
    venv = work / "uv-venv"

    def install(link_mode: str | None) -> tuple[float, float]:
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run(
            [args.uv, "venv", "-q", "--python", args.python, str(venv)], env=env, check=True
        )
        cmd = [args.uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python")]
        cmd += ["--link-mode", link_mode] if link_mode else []
        cmd += ["-r", str(args.requirements), *args.uv_args]
        c0, t0 = cpu_children(), time.perf_counter()
        subprocess.run(cmd, env=env, check=True)
        return time.perf_counter() - t0, cpu_children() - c0

    install(None)  # warm the cache
    out: dict[str, object] = {"requirements": args.requirements.read_text().split()}
    for mode in ("hardlink", "copy"):
        runs = [install(mode) for _ in range(args.runs)]
        walls, cpus = [r[0] for r in runs], [r[1] for r in runs]
        out[mode] = {
            "wall_s": walls,
            "cpu_s": cpus,
            "median_wall_s": statistics.median(walls),
            "median_cpu_s": statistics.median(cpus),
        }
        print(
            f"BENCH uv warm {mode}: median {statistics.median(walls):.2f}s "
            f"{statistics.median(cpus):.2f} CPU-s  load1 {os.getloadavg()[0]:.1f}"
        )
    shutil.rmtree(venv, ignore_errors=True)
    out["load1"] = os.getloadavg()[0]
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
