"""The image read path: a job's reads through the agent's FUSE mount against the same
bytes from local disk, with every block already in the node's cache (issue 19, item 3).

A real agent (``tests.imagekit``: its own config, store, cache and mount) serves a path
image of incompressible data, squashed without compression (``--size-mib``, 1 GiB by
default). One warm-up job reads it all, so every block is in the agent's cache. Then, for
each round, alternating which side goes first:

- ``image_first_read``: a new job's file (a fresh inode: its page cache is empty), read
  sequentially in 1 MiB reads, the cache's block files dropped from the page cache
  (``POSIX_FADV_DONTNEED``, per file: nothing else on the machine is touched); floor:
  the image file on local disk, dropped the same way;
- ``image_reread``: the same two files read again (page cache);
- ``image_squashfs``: squashfuse on the job's file, every file inside read (the requests
  squashfs makes), against squashfuse on the local image file, both cold.

Figures: seconds and MB/s each side (medians), their ratio (bootseer / floor), and the
agent's CPU seconds per GiB (``/proc/<pid>/stat``: all its threads); load1 as seen.

    python3 slurm-dev/bench/image/readpath.py --label after --json OUT.json [--size-mib 1024]

``--json`` appends this run's records to the file (a list), so one file holds before and
after. Run as root (FUSE, job files); it cleans up its directory, 2x the image on disk.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TOP = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(TOP))
sys.path.insert(0, str(TOP / "slurm-dev"))
sys.path.insert(0, str(TOP / "lib"))
sys.path.insert(0, str(TOP / "slurm-dev" / "bench"))

from measure import drop_pages  # noqa: E402
from tests.imagekit import AgentProc, running_agent  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30
CHUNK = 1 << 20
TICK = os.sysconf("SC_CLK_TCK")


def drop_tree(root: Path) -> None:
    for dirpath, _, names in os.walk(root):
        for n in names:
            with contextlib.suppress(FileNotFoundError):
                drop_pages(Path(dirpath) / n)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (all threads)


def sys_s(pid: int) -> float:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[12]) / TICK


def own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def read_all(path: Path) -> int:
    buf = bytearray(CHUNK)
    n = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while got := os.readv(fd, [buf]):
            n += got
    finally:
        os.close(fd)
    return n


def read_tree(root: Path) -> int:
    n = 0
    for dirpath, _, names in os.walk(root):
        for name in sorted(names):
            n += read_all(Path(dirpath) / name)
    return n


@contextlib.contextmanager
def squashfuse(image: Path, mnt: Path) -> Iterator[Path]:
    mnt.mkdir(exist_ok=True)
    subprocess.run(["squashfuse", str(image), str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False)


def make_image(work: Path, size_mib: int) -> Path:
    src = work / "src"
    src.mkdir()
    files = max(1, size_mib // 64)
    for i in range(files):
        with open(src / f"f{i:03d}.bin", "wb") as f:
            for _ in range(size_mib // files):
                f.write(os.urandom(MIB))
    img = work / "img.sqsh"
    subprocess.run(
        [
            "mksquashfs",
            str(src),
            str(img),
            "-noappend",
            "-quiet",
            "-no-progress",
            "-noI",
            "-noD",
            "-noF",
            "-noX",
        ],
        check=True,
        capture_output=True,
    )
    shutil.rmtree(src)
    img.chmod(0o644)
    return img


class Timed:
    def __init__(self, agent: AgentProc) -> None:
        assert agent.proc is not None
        self.pid = agent.proc.pid
        self.kernel = 0.0  # the agent's system CPU, over every timed call
        self.reader = 0.0  # this process's own CPU (the reading side), over every call

    def __call__(self, fn: Any, *args: Any) -> tuple[int, float, float]:
        c0, k0, r0, t0 = cpu_s(self.pid), sys_s(self.pid), own_cpu_s(), time.perf_counter()
        n = fn(*args)
        t = time.perf_counter() - t0
        self.kernel += sys_s(self.pid) - k0
        self.reader += own_cpu_s() - r0
        return n, t, cpu_s(self.pid) - c0


def record(
    path: str,
    label: str,
    nbytes: int,
    ours: list[float],
    floor: list[float],
    cpu: list[float],
    loads: list[float],
) -> dict[str, Any]:
    b, f = statistics.median(ours), statistics.median(floor)
    return {
        "path": path,
        "label": label,
        "bytes": nbytes,
        "bootseer_s": round(b, 4),
        "floor_s": round(f, 4),
        "ratio": round(b / f, 3),  # >1: slower than the floor
        "speed_vs_floor": round(f / b, 3),  # the target's figure: >= 0.7 / 0.9
        "bootseer_mb_s": round(nbytes / b / 1e6, 1),
        "floor_mb_s": round(nbytes / f / 1e6, 1),
        "cpu_s_per_gib": round(statistics.median(cpu) / (nbytes / GIB), 3),
        "rounds": len(ours),
        "nodes": 1,
        "load1": round(statistics.median(loads), 2),
        "load1_range": [min(loads), max(loads)],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", default="run")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--work", type=Path, default=Path(os.environ.get("BOOTSEER_TEST_STATE", "/var/tmp"))
    )
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="readpath-", dir=args.work))
    base.chmod(0o755)
    try:
        out = run(base, args)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for r in out:
        print(json.dumps(r))
    if args.json:
        old = json.loads(args.json.read_text()) if args.json.exists() else []
        args.json.write_text(json.dumps(old + out, indent=1) + "\n")


def run(base: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    img = make_image(base, args.size_mib)
    size = img.stat().st_size
    res: dict[str, list[float]] = {
        k: []
        for k in (
            "first",
            "first_floor",
            "first_cpu",
            "re",
            "re_floor",
            "re_cpu",
            "sq",
            "sq_floor",
            "sq_cpu",
            "load",
            "floor_cpu",
        )
    }
    sq_bytes = 0
    with running_agent(base, block_size_kib=256, fetch_timeout=30.0) as agent:
        timed = Timed(agent)
        warm = Path(agent.prepare(1, str(img))["path"])
        assert read_all(warm) == size
        agent.release(1)
        job = 10
        for rnd in range(args.rounds):
            res["load"].append(os.getloadavg()[0])
            job += 1
            lazy = Path(agent.prepare(job, str(img))["path"])
            sides = ["fuse", "floor"] if rnd % 2 == 0 else ["floor", "fuse"]
            for side in sides:
                if side == "fuse":
                    drop_tree(agent.cache)
                    n, t, c = timed(read_all, lazy)
                    assert n == size
                    res["first"].append(t)
                    res["first_cpu"].append(c)
                    n, t, c = timed(read_all, lazy)
                    res["re"].append(t)
                    res["re_cpu"].append(c)
                else:
                    drop_pages(img)
                    r0 = own_cpu_s()
                    res["first_floor"].append(timed(read_all, img)[1])
                    res["floor_cpu"].append(own_cpu_s() - r0)
                    res["re_floor"].append(timed(read_all, img)[1])
            job += 1
            lazy2 = Path(agent.prepare(job, str(img))["path"])
            for side in sides:
                with squashfuse(lazy2 if side == "fuse" else img, base / "sq") as mnt:
                    if side == "fuse":
                        drop_tree(agent.cache)
                        sq_bytes, t, c = timed(read_tree, mnt)
                        res["sq"].append(t)
                        res["sq_cpu"].append(c)
                    else:
                        drop_pages(img)
                        res["sq_floor"].append(timed(read_tree, mnt)[1])
            agent.release(job - 1)
            agent.release(job)
    L = args.label
    first = record(
        "image_first_read", L, size, res["first"], res["first_floor"], res["first_cpu"], res["load"]
    )
    # What reading the local file cost the reading process itself (the kernel's copies),
    # and what share of the agent's CPU was the kernel's (its system time), over all reads.
    first["floor_reader_cpu_s_per_gib"] = round(
        statistics.median(res["floor_cpu"]) / (size / GIB), 3
    )
    agent_cpu = sum(res["first_cpu"]) + sum(res["re_cpu"]) + sum(res["sq_cpu"])
    first["agent_system_cpu_share"] = round(timed.kernel / agent_cpu, 3) if agent_cpu else None
    return [
        first,
        record("image_reread", L, size, res["re"], res["re_floor"], res["re_cpu"], res["load"]),
        record(
            "image_squashfs", L, sq_bytes, res["sq"], res["sq_floor"], res["sq_cpu"], res["load"]
        ),
    ]


if __name__ == "__main__":
    main()
