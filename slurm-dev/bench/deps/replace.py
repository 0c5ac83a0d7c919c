"""A replacing restore at real size: main's (the old tree deleted inside the restore)
against this checkout's (set aside, deleted later by the epilog's sweep), alternating.

The situation of a dev iteration: the prefix already holds a restored tree of about the
same size (new dependencies, same prefix path), and the prolog restores another snapshot
over it. ``SRC`` is captured once into a file:// store under ``WORK`` (restore_floor.py's
``prepared``); every timed run restores it with ``replace=True`` over the tree the run
before left in ``WORK/prefix``. Each run is a child process importing bootseer from one
``lib`` directory (``--main-lib``: a checkout of main; this checkout's own), so the two
codes run unchanged on one machine in one sitting.

In main's child ``shutil.rmtree`` of the restoring child (forked: it inherits the
wrapper) is timed, so the delete's share of main's restore is measured, not assumed. In
this checkout's child the restore returns with the old tree set aside; then the sweep
the epilog runs (:func:`bootseer.deps.oldtree.sweep`) is timed on its own. Both leave the
disk in the same state (the old tree gone just after the restore), then ``sync`` and
``--settle`` seconds (61: ext4 without a journal rescans inodes freed in the last 60 s on
every create, docs/performance.md "Restores after deletes").

    python3 replace.py /var/tmp/ot/src /var/tmp/ot/work --runs 4 --main-lib /work/main/lib
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
OURS = HERE.parents[3] / "lib"
RMTREE_LOG = "rmtree.log"


def _cpu() -> float:
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def _timed_rmtree(log: Path) -> None:
    """Wrap the ``shutil.rmtree`` bootseer's archive module calls: each call on an old
    tree appends its wall seconds to ``log`` (from the forked restoring child too)."""
    import shutil
    import types

    from bootseer.deps import archive

    real = shutil.rmtree

    def rmtree(path: Any, *a: Any, **kw: Any) -> None:
        t0 = time.perf_counter()
        real(path, *a, **kw)
        if ".bootseer-old-" in str(path):
            with open(log, "a") as f:
                f.write(f"{time.perf_counter() - t0:.4f}\n")

    shim = types.SimpleNamespace(**{k: getattr(shutil, k) for k in dir(shutil) if k[0] != "_"})
    shim.rmtree = rmtree
    archive.shutil = shim  # type: ignore[assignment]


def one(work: Path, variant: str) -> dict[str, Any]:
    """One replacing restore (in a child process with ``sys.path`` set to the variant's lib)."""
    from bootseer.deps.restore import read_manifest, restore
    from bootseer.store import open_store

    sys.path.insert(0, str(HERE.parent))
    from restore_floor import KEY, SCOPE, request

    store = open_store(f"file://{work}/store")
    found = read_manifest(store, SCOPE, KEY, max_bytes=1 << 40, max_files=10**7, keys=None)
    assert found is not None
    m = found[0]
    log = work / RMTREE_LOG
    log.unlink(missing_ok=True)
    _timed_rmtree(log)
    replace = os.path.isdir(m.prefix)
    c0, t0 = _cpu(), time.perf_counter()
    restore(store, m, request(m.prefix, replace=replace))
    wall, used = time.perf_counter() - t0, _cpu() - c0
    rm = [float(x) for x in log.read_text().split()] if log.exists() else []
    out: dict[str, Any] = {
        "variant": variant,
        "replace": replace,
        "restore_s": wall,
        "restore_cpu_s": used,
        "rmtree_in_restore_s": sum(rm),
        "raw_bytes": m.raw_bytes,
        "entries": len(m.entries),
    }
    if variant == "branch":
        from bootseer.deps import oldtree

        c0, t0 = _cpu(), time.perf_counter()
        swept = oldtree.sweep(m.prefix)
        out["sweep_s"] = time.perf_counter() - t0
        out["sweep_cpu_s"] = _cpu() - c0
        out["swept"] = swept
    return out


def run_one(work: Path, variant: str, lib: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(lib)}
    proc = subprocess.run(
        [sys.executable, str(HERE), "--one", variant, "x", str(work)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    rec: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return rec


def settle(seconds: float) -> None:
    subprocess.run(["sync"], check=True)
    time.sleep(seconds)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("src", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("--runs", type=int, default=4, help="timed runs of each variant")
    ap.add_argument("--main-lib", type=Path, default=Path("/work/main/lib"))
    ap.add_argument("--settle", type=float, default=61.0)
    ap.add_argument("--variants", default="main,branch")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    work = args.work.resolve()
    if args.one:
        print(json.dumps(one(work, args.one)))
        return 0
    sys.path.insert(0, str(OURS))
    sys.path.insert(0, str(HERE.parent))
    from restore_floor import prepared

    _, m = prepared(args.src.resolve(), work)
    print(f"snapshot: {m.raw_bytes >> 20} MiB raw, {len(m.entries)} entries")
    libs = {"main": args.main_lib.resolve(), "branch": OURS}
    variants = args.variants.split(",")
    if not os.path.isdir(m.prefix):
        run_one(work, variants[0], libs[variants[0]])  # the tree the first run replaces
    settle(args.settle)
    recs: list[dict[str, Any]] = []
    for i in range(args.runs):
        order = variants if i % 2 == 0 else variants[::-1]
        for v in order:
            load = os.getloadavg()[0]
            rec = run_one(work, v, libs[v])
            rec["load1_before"] = load
            rec["load1_after"] = os.getloadavg()[0]
            recs.append(rec)
            print(
                f"run {i} {v}: restore {rec['restore_s']:.2f}s {rec['restore_cpu_s']:.2f} CPU-s, "
                f"rmtree inside {rec['rmtree_in_restore_s']:.2f}s"
                + (f", epilog sweep {rec['sweep_s']:.2f}s" if "sweep_s" in rec else "")
                + f"  load1 {load:.1f}",
                flush=True,
            )
            settle(args.settle)
    summary: dict[str, Any] = {}
    for v in variants:
        mine = [r for r in recs if r["variant"] == v]
        summary[v] = {
            k: statistics.median(r[k] for r in mine)
            for k in ("restore_s", "restore_cpu_s", "rmtree_in_restore_s", "sweep_s")
            if all(k in r for r in mine)
        }
        gib = m.raw_bytes / (1 << 30)
        summary[v]["restore_cpu_s_per_gib"] = summary[v]["restore_cpu_s"] / gib
        print(f"BENCH {v}: " + ", ".join(f"{k} {x:.2f}" for k, x in summary[v].items()))
    if "main" in summary and "branch" in summary:
        r = summary["branch"]["restore_s"] / summary["main"]["restore_s"]
        print(f"BENCH branch/main restore wall {r:.2f}x")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "raw_bytes": m.raw_bytes,
                    "entries": len(m.entries),
                    "runs": recs,
                    "median": summary,
                },
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
