"""Local restore against the extraction floor, alternating, in one run.

Captures ``SRC`` once into a file:// store under ``WORK`` (as the tree ``WORK/prefix``),
then alternates ``--runs`` times: bootseer's restore of that snapshot into
``WORK/prefix``, and ``tar -I zstd -xf`` of the same archive object into a fresh
directory (``--before``: first, the restore with the tarfile extractor too). Prints
per-run times, the medians, the ratio, the parent's and child's CPU and the load average.

    python3 restore_floor.py /var/tmp/deps-perf/src /var/tmp/deps-perf --runs 5
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "lib"))

from bootseer.deps.capture import CaptureRequest, capture
from bootseer.deps.layout import SnapshotPaths
from bootseer.deps.manifest import Manifest
from bootseer.deps.restore import RestoreRequest, read_manifest, restore
from bootseer.store import open_store

SCOPE, BASE, KEY = "user/bench", "b" * 32, "f" * 32
SETTLE = 5.0  # seconds; --settle
ROOTS = ["/usr", "/opt", "/root/.pyenv"]  # python3 on PATH lives in pyenv here


def prepared(src: Path, work: Path) -> tuple[str, Manifest]:
    uri = f"file://{work}/store"
    store = open_store(uri)
    found = read_manifest(store, SCOPE, KEY, max_bytes=1 << 40, max_files=10**7, keys=None)
    if found is None:
        prefix = work / "prefix"
        if src != prefix:  # SRC may be WORK/prefix itself (a 1 GB tree need not be twice)
            shutil.rmtree(prefix, ignore_errors=True)
            shutil.copytree(src, prefix, symlinks=True)
        capture(
            store,
            CaptureRequest(
                prefix=str(prefix),
                scope=SCOPE,
                base=BASE,
                key=KEY,
                uid=os.getuid(),
                gid=os.getgid(),
                max_bytes=1 << 40,
                max_files=10**7,
            ),
            keys=None,  # a local benchmark: nothing root-run reads these
        )
        found = read_manifest(store, SCOPE, KEY, max_bytes=1 << 40, max_files=10**7, keys=None)
        assert found is not None
    return uri, found[0]


def request(prefix: str, **kw: Any) -> RestoreRequest:
    """A restore of the bench's snapshot into ``prefix`` as this process's user, the
    site's limits lifted (``kw``: ``extractor``, ``replace``)."""
    return RestoreRequest(
        prefix=prefix,
        uid=os.getuid(),
        gid=os.getgid(),
        link_roots=ROOTS,
        max_bytes=1 << 40,
        max_files=10**7,
        **kw,
    )


def settle(path: str | Path) -> None:
    # On this VM, removing 400 MiB of fresh files leaves the kernel work for seconds after
    # (freeing blocks and pages); the next timed run would pay for it.
    shutil.rmtree(path, ignore_errors=True)
    subprocess.run(["sync"], check=True)
    time.sleep(SETTLE)


def cpu() -> float:
    """CPU seconds of this process and its reaped children (the extracting child, tar, zstd)."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def cpu_split() -> tuple[float, float]:
    """CPU seconds of this process (the fetching, verifying, decoding parent) and of its
    reaped children (the extracting child and its tar; tar and zstd for the floor)."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime, b.ru_utime + b.ru_stime


def time_restore(
    uri: str, m: Manifest, other: Path, extractor: str = "tar"
) -> tuple[float, float, float, float]:
    """Wall and CPU seconds of one restore (the settling before it not counted), then
    the parent's and the child's CPU seconds."""
    settle(other)  # one tree on disk at a time: a 1 GB install thrice does not fit
    settle(m.prefix)
    (p0, k0), t0 = cpu_split(), time.perf_counter()
    restore(open_store(uri), m, request(m.prefix, extractor=extractor))
    wall = time.perf_counter() - t0
    p1, k1 = cpu_split()
    return wall, p1 - p0 + k1 - k0, p1 - p0, k1 - k0


def time_tar(archive: str, dest: Path, other: str) -> tuple[float, float]:
    settle(other)
    settle(dest)
    c0, t0 = cpu(), time.perf_counter()
    dest.mkdir()
    subprocess.run(["tar", "-I", "zstd", "-xf", archive, "-C", str(dest)], check=True)
    return time.perf_counter() - t0, cpu() - c0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("src", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--settle", type=float, default=5.0, help="seconds between runs")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--label", default="", help="what this run measures (into the JSON)")
    ap.add_argument(
        "--before",
        action="store_true",
        help="also the tarfile extractor (extractor='python', the restore before GNU tar) "
        "in every run, alternating",
    )
    args = ap.parse_args(argv)
    global SETTLE
    SETTLE = args.settle
    uri, m = prepared(args.src.resolve(), args.work.resolve())
    archive = f"{args.work.resolve()}/store/{SnapshotPaths(SCOPE, KEY).data(m.data)}"
    print(
        f"snapshot: {m.raw_bytes >> 20} MiB raw, {m.stored_bytes >> 20} MiB stored, "
        f"{len(m.entries)} entries, {len(m.frames)} frames"
    )
    ours: list[float] = []
    floor: list[float] = []
    ours_cpu: list[float] = []
    floor_cpu: list[float] = []
    split: list[tuple[float, float]] = []  # the restore's parent and child CPU-s
    before: list[float] = []  # --before: the tarfile extractor (main before issue 19's)
    before_cpu: list[float] = []
    before_split: list[tuple[float, float]] = []
    loads = [os.getloadavg()[0]]
    print(f"load before: {os.getloadavg()}")
    tar_out = args.work.resolve() / "tar-out"
    for i in range(args.runs):
        if args.before:
            wall, used, par, kid = time_restore(uri, m, tar_out, "python")
            before.append(wall)
            before_cpu.append(used)
            before_split.append((par, kid))
            print(
                f"run {i}: restore (tarfile) {wall:.2f}s {used:.2f} CPU-s "
                f"(parent {par:.2f}, child {kid:.2f})"
            )
        wall, used, par, kid = time_restore(uri, m, tar_out)
        ours.append(wall)
        ours_cpu.append(used)
        split.append((par, kid))
        wall, used = time_tar(archive, tar_out, m.prefix)
        floor.append(wall)
        floor_cpu.append(used)
        loads.append(os.getloadavg()[0])
        print(
            f"run {i}: restore {ours[-1]:.2f}s {ours_cpu[-1]:.2f} CPU-s "
            f"(parent {par:.2f}, child {kid:.2f})  "
            f"tar {floor[-1]:.2f}s {floor_cpu[-1]:.2f} CPU-s  load1 {loads[-1]:.1f}"
        )
    settle(tar_out)
    a, b = statistics.median(ours), statistics.median(floor)
    ca, cb = statistics.median(ours_cpu), statistics.median(floor_cpu)
    gib = m.raw_bytes / (1 << 30)
    print(f"BENCH restore median {a:.2f}s  tar median {b:.2f}s  ratio {a / b:.2f}x")
    print(
        f"BENCH CPU-s/GiB restore {ca / gib:.2f}  tar {cb / gib:.2f}  ratio {ca / cb:.2f}x; "
        f"MB/s restore {m.raw_bytes / a / 1e6:.0f}  tar {m.raw_bytes / b / 1e6:.0f}"
    )
    print(
        f"BENCH restore CPU-s median parent {statistics.median(p for p, _ in split):.2f}  "
        f"child {statistics.median(k for _, k in split):.2f}"
    )
    if before:
        z = statistics.median(before)
        print(
            f"BENCH before (tarfile) median {z:.2f}s  ratio to tar {z / b:.2f}x  CPU-s "
            f"{statistics.median(before_cpu):.2f} (parent "
            f"{statistics.median(p for p, _ in before_split):.2f}, child "
            f"{statistics.median(k for _, k in before_split):.2f})"
        )
    print(f"load after: {os.getloadavg()}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "label": args.label,
                    "raw_bytes": m.raw_bytes,
                    "stored_bytes": m.stored_bytes,
                    "entries": len(m.entries),
                    "frames": len(m.frames),
                    "restore_s": ours,
                    "tar_s": floor,
                    "restore_cpu_s": ours_cpu,
                    "tar_cpu_s": floor_cpu,
                    "load1": loads,
                    "restore_cpu_parent_child_s": split,
                    "before_s": before,
                    "before_cpu_s": before_cpu,
                    "before_cpu_parent_child_s": before_split,
                    "median": {"restore_s": a, "tar_s": b, "ratio": a / b},
                    "cpu_s_per_gib": {"restore": ca / gib, "tar": cb / gib, "ratio": ca / cb},
                    "mb_per_s": {"restore": m.raw_bytes / a / 1e6, "tar": m.raw_bytes / b / 1e6},
                },
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
