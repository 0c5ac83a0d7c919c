#!/usr/bin/env python3
"""The block cache's own cost per GiB: putting verified blocks, and reading them back.

What the agent's fetch workers do with each block after its SHA-256 checked
(``BlockCache.put``: written past the page cache, its CRC-32C pieces recorded), and what a
job's reads do (``BlockCache.read_into``: the pieces read and checked), with the cache
under its cap the whole time in the second put phase (every put evicts), as on a node
whose cache is full. CPU is ``getrusage(RUSAGE_SELF)`` (all threads, user + system),
``--threads`` putting at once (the agent's fetch workers); the blocks are made before
the clock starts (``os.urandom``), and their SHA-256 is not counted (the caller's).

Several trees (``--trees /work/main,/work/wt-x``: each one's ``lib`` is imported by a
child process of its own) are run round by round, alternated, so that each sees the
same minutes' load; one tree (the default) is this file's own::

    $BOOTSEER_VENV/bin/python slurm-dev/bench/image/cache_put.py --gib 1 --rounds 3 \\
        --trees /work/main,/work/wt-packcache --json out.json

Records: ``tree``, ``phase`` (put, put_evicting, read), ``cpu_s_per_gib``,
``sys_share``, ``seconds``, ``mb_s``, ``load1``; the JSON holds them and their medians
per tree and phase. The cache directory (under ``--dir``, default /var/tmp) is removed.
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
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

GIB = 1 << 30
HERE = Path(__file__).resolve().parents[3]


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def sys_cpu() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def child(tree: Path, work: Path, total: int, block: int, threads: int) -> list[dict[str, Any]]:
    """One round of one tree, in this (child) process: its own lib imported."""
    sys.path.insert(0, str(tree / "lib"))
    from bootseer.image.blocks import digest
    from bootseer.image.cache import BlockCache

    n = total // block
    base = bytearray(os.urandom(block))
    blocks: list[tuple[str, bytes]] = []
    for i in range(2 * n):  # the second half pushes the first out
        base[:8] = i.to_bytes(8, "big")
        b = bytes(base)
        blocks.append((digest(b), b))
    cache = BlockCache(work / "cache", cap_bytes=total)
    out = []

    def timed(phase: str, jobs: list[tuple[str, bytes]], fn: Any) -> None:
        parts = [jobs[k::threads] for k in range(threads)]
        workers = [threading.Thread(target=lambda p=p: [fn(d, b) for d, b in p]) for p in parts]
        t0, c0, s0 = time.monotonic(), cpu(), sys_cpu()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        seconds, used, system = time.monotonic() - t0, cpu() - c0, sys_cpu() - s0
        moved = len(jobs) * block
        out.append(
            {
                "tree": str(tree),
                "phase": phase,
                "bytes": moved,
                "seconds": round(seconds, 3),
                "mb_s": round(moved / seconds / 1e6, 1),
                "cpu_s_per_gib": round(used / (moved / GIB), 3),
                "sys_share": round(system / max(used, 1e-9), 2),
                "load1": round(os.getloadavg()[0], 2),
            }
        )

    def read(d: str, b: bytes) -> None:
        buf = bytearray(len(b))
        if not cache.read_into(d, 0, memoryview(buf)):
            raise SystemExit(f"block {d[:12]} not read back")

    timed("put", blocks[:n], cache.put)
    timed("put_evicting", blocks[n:], cache.put)
    if len(cache) != n:
        raise SystemExit(f"{len(cache)} blocks held, not {n}")
    os.sync()
    # Cold: the pages were written past the page cache; drop any the kernel kept.
    for f in (work / "cache").rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    timed("read", blocks[n:], read)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--block-kib", type=int, default=256)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--trees", default=str(HERE))
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    ap.add_argument("--child", type=Path)  # internal: a tree's round
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    total, block = int(a.gib * GIB), a.block_kib << 10
    if a.child is not None:
        work = Path(tempfile.mkdtemp(prefix="bs-cacheput-", dir=a.dir))
        try:
            print(json.dumps(child(a.child, work, total, block, a.threads)))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    trees = [Path(t).resolve() for t in a.trees.split(",")]
    records: list[dict[str, Any]] = []
    for _ in range(a.rounds):
        for tree in trees:
            args = [sys.executable, __file__, "--child", str(tree), "--gib", str(a.gib)]
            args += ["--block-kib", str(a.block_kib), "--threads", str(a.threads)]
            args += ["--dir", str(a.dir)]
            env = {**os.environ, "PYTHONPATH": str(tree / "lib")}
            got = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
            if got.returncode:
                raise SystemExit(f"{tree}: {got.stderr.strip()[-2000:]}")
            for r in json.loads(got.stdout.strip().splitlines()[-1]):
                records.append(r)
                print(
                    f"{r['tree']:28} {r['phase']:13} {r['cpu_s_per_gib']:6.2f} CPU-s/GiB "
                    f"(sys {r['sys_share']:.2f}), {r['mb_s']:7.1f} MB/s, load1 {r['load1']}",
                    flush=True,
                )
    keys = ("cpu_s_per_gib", "sys_share", "mb_s", "seconds", "load1")
    medians = {
        str(t): {
            ph: {
                k: statistics.median(
                    r[k] for r in records if r["tree"] == str(t) and r["phase"] == ph
                )
                for k in keys
            }
            for ph in ("put", "put_evicting", "read")
        }
        for t in trees
    }
    print(json.dumps(medians, indent=1))
    if a.json:
        doc = {"gib": a.gib, "threads": a.threads, "runs": records, "medians": medians}
        a.json.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
