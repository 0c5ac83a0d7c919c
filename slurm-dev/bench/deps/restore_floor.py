"""Local restore against the extraction floor, alternating, in one run.

Captures ``SRC`` once into a file:// store under ``WORK`` (as the tree ``WORK/prefix``),
then alternates ``--runs`` times: bootseer's restore of that snapshot into
``WORK/prefix``, and ``tar -I zstd -xf`` of the same archive object into a fresh
directory. Prints per-run times, the medians, the ratio and the load average.

    python3 restore_floor.py /var/tmp/deps-perf/src /var/tmp/deps-perf --runs 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

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


def settle(path: str | Path) -> None:
    # On this VM, removing 400 MiB of fresh files leaves the kernel work for seconds after
    # (freeing blocks and pages); the next timed run would pay for it.
    shutil.rmtree(path, ignore_errors=True)
    subprocess.run(["sync"], check=True)
    time.sleep(SETTLE)


def time_restore(uri: str, m: Manifest) -> float:
    settle(m.prefix)
    t0 = time.perf_counter()
    restore(
        open_store(uri),
        m,
        RestoreRequest(
            prefix=m.prefix,
            uid=os.getuid(),
            gid=os.getgid(),
            link_roots=ROOTS,
            max_bytes=1 << 40,
            max_files=10**7,
        ),
    )
    return time.perf_counter() - t0


def time_tar(archive: str, dest: Path) -> float:
    settle(dest)
    t0 = time.perf_counter()
    dest.mkdir()
    subprocess.run(["tar", "-I", "zstd", "-xf", archive, "-C", str(dest)], check=True)
    return time.perf_counter() - t0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("src", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--settle", type=float, default=5.0, help="seconds between runs")
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
    print(f"load before: {os.getloadavg()}")
    for i in range(args.runs):
        ours.append(time_restore(uri, m))
        floor.append(time_tar(archive, args.work.resolve() / "tar-out"))
        print(f"run {i}: restore {ours[-1]:.2f}s  tar {floor[-1]:.2f}s")
    a, b = statistics.median(ours), statistics.median(floor)
    print(f"BENCH restore median {a:.2f}s  tar median {b:.2f}s  ratio {a / b:.2f}x")
    print(f"load after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
