"""A job's reads of its image through the agent's FUSE mount, against the local disk.

The path the realsize benchmark's ``image_first_read`` and ``image_reread`` measure
end to end, alone and small enough to profile: one agent (no Slurm), an image of
``--mib`` MiB of random data (squashfs, as ``bootseer image add`` takes it), every
block already in the agent's cache (prefetched, as on a node whose hot set arrived),
then, with the page cache dropped before each cold read:

- ``first``: a new job's file read whole through the mount (every request answered
  by the agent from its block cache: disk read, CRC check, FUSE copy);
- ``first_warm``: a new job's file read whole, its blocks in the page cache (as they
  are just after the prefetch wrote them): the agent's own cost per byte;
- ``reread``: the same file again (the kernel's page cache of the FUSE inode);
- ``floor``: the image file on local disk, cold, then warm (``floor_warm``).

Reads are sequential, ``--read-kib`` at a time, as squashfs and torch's loader read.
Prints MB/s and the agent's CPU seconds per GiB, and writes JSON with ``--json``::

    /opt/bootseer/venv/bin/python3 slurm-dev/bench/image/readpath.py --mib 1024
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOP = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(TOP / "lib"), str(TOP)]

import psutil  # noqa: E402
from tests.imagekit import add_image, make_squashfs, running_agent  # noqa: E402

MIB = 1 << 20


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def read_all(path: Path, chunk: int) -> tuple[int, float]:
    fd = os.open(path, os.O_RDONLY)
    buf = bytearray(chunk)
    n = 0
    t0 = time.perf_counter()
    try:
        while k := os.readv(fd, [buf]):
            n += k
    finally:
        os.close(fd)
    return n, time.perf_counter() - t0


def cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mib", type=int, default=1024, help="image size (MiB)")
    ap.add_argument("--block-kib", type=int, default=256, help="the image's block size")
    ap.add_argument("--read-kib", type=int, default=1024, help="each read() of the job")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--profile", help="py-spy's raw profile of the agent's first cold read")
    ap.add_argument("--dir", default="/var/tmp", help="where the image and agent live")
    args = ap.parse_args()
    chunk = args.read_kib << 10
    with tempfile.TemporaryDirectory(prefix="bootseer-readpath-", dir=args.dir) as d:
        base = Path(d)
        base.chmod(0o755)
        files = {f"lib/part{i}.so": 64 * MIB for i in range(args.mib // 64)}
        image = make_squashfs(base / "img.sqsh", files)
        add_image(base, image, "bench:1", args.block_kib)
        size = image.stat().st_size
        runs: dict[str, list[float]] = {
            k: [] for k in ("first", "first_warm", "reread", "floor", "floor_warm")
        }
        cpus: dict[str, list[float]] = {k: [] for k in ("first", "first_warm", "reread")}
        with running_agent(base, block_size_kib=args.block_kib) as agent:
            assert agent.proc is not None
            proc = psutil.Process(agent.proc.pid)
            job = 1
            warm = Path(agent.prepare(job, "bench:1")["path"])
            read_all(warm, chunk)  # every block into the agent's cache
            agent.release(job)
            for _ in range(args.rounds):
                job += 1
                lazy = Path(agent.prepare(job, "bench:1")["path"])
                for name, path in (("first", lazy), ("reread", lazy)):
                    if name == "reread":  # and a first read from blocks in the page cache
                        agent.release(job)
                        job += 1
                        lazy = Path(agent.prepare(job, "bench:1")["path"])
                        c0 = cpu(proc)
                        n, secs = read_all(lazy, chunk)
                        runs["first_warm"].append(secs)
                        cpus["first_warm"].append((cpu(proc) - c0) / (n / (1 << 30)))
                        path = lazy
                    spy = None
                    if name == "first":
                        drop_caches()
                        if args.profile and job == 2:
                            spy = subprocess.Popen(
                                [
                                    str(Path(sys.executable).parent / "py-spy"),
                                    "record",
                                    "--nonblocking",
                                    "--threads",
                                    "-f",
                                    "raw",
                                    "-o",
                                    args.profile,
                                    "-p",
                                    str(proc.pid),
                                ],
                                stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL,
                            )
                            time.sleep(1.0)  # py-spy attaches
                    c0 = cpu(proc)
                    n, secs = read_all(path, chunk)
                    if spy is not None:
                        spy.send_signal(signal.SIGINT)
                        spy.wait()
                    assert n == size, (n, size)
                    runs[name].append(secs)
                    cpus[name].append((cpu(proc) - c0) / (n / (1 << 30)))
                agent.release(job)
                drop_caches()
                runs["floor"].append(read_all(image, chunk)[1])
                runs["floor_warm"].append(read_all(image, chunk)[1])
        med = {k: statistics.median(v) for k, v in runs.items()}
        out = {
            "bytes": size,
            "block_kib": args.block_kib,
            "read_kib": args.read_kib,
            "rounds": args.rounds,
            "load1": os.getloadavg()[0],
            **{f"{k}_s": v for k, v in med.items()},
            **{f"{k}_mb_s": size / v / 1e6 for k, v in med.items()},
            "first_vs_floor": med["floor"] / med["first"],
            "first_warm_vs_page_cache": med["floor_warm"] / med["first_warm"],
            "reread_vs_page_cache": med["floor_warm"] / med["reread"],
            **{f"{k}_cpu_s_per_gib": statistics.median(v) for k, v in cpus.items()},
        }
    for k, v in out.items():
        print(f"{k:>24} {v:.3f}" if isinstance(v, float) else f"{k:>24} {v}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
