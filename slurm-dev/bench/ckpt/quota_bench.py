"""What the checkpoint quota costs per file close, through the real mount.

A saver writes F small files (``--file-kib``, default 64 KiB: one partial unit each, so a
close is one unit upload and one manifest, both charged to the quota) through a fresh
mount of each variant, alternating the order every round so all meet the same load:

- ``off``: ``[ckpt.quota] user = 0``: no quota, nothing counted;
- ``on``: a quota far above what the user holds, ``quota_rescan = 10`` (the default): a
  count of the user's directory when the mount first writes and then every 10 s;
- ``count``: the same with ``quota_rescan = 0``: a count before every upload, the cost of
  a writer whose count is always stale (the upper bound: a close near the quota).

The user already holds ``--population`` objects (other checkpoints' units and manifests,
spread over the K = 3 ``file://`` targets on the local disk), which is what a count lists.
Reported: the median time per close (open, write, close) of each variant, the
differences to ``off``, the daemon's CPU time per file, the load average, and what one
count of that population and one charge between counts cost by themselves
(``QuotaGuard`` outside the mount).

    $BOOTSEER_VENV/bin/python slurm-dev/bench/ckpt/quota_bench.py --smoke      # ~1 minute
    $BOOTSEER_VENV/bin/python slurm-dev/bench/ckpt/quota_bench.py --files 300 --rounds 5 \\
        --population 10000 --out slurm-dev/bench/ckpt/results-quota

Runs as root (FUSE). Mounts, daemons and data under ``--state-dir`` are removed at the
end, even on failure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TOP = HERE.parents[2]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(TOP / "lib"))

from benchrun import add_state_and_out, in_fresh_state, write_results  # noqa: E402
from bootseer.ckpt import mount as ckpt_mount  # noqa: E402
from bootseer.ckpt.quota import QuotaGuard, Scope  # noqa: E402
from bootseer.store import open_store  # noqa: E402

UNIT = 8 << 20
K = 3
USER = "bench"
VARIANTS: dict[str, dict[str, Any]] = {
    "off": {"quota": 0, "rescan": 10.0},
    "on": {"quota": 1 << 40, "rescan": 10.0},
    "count": {"quota": 1 << 40, "rescan": 0.0},
}
SAVER = """
    import os, sys, time
    d, files, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    os.makedirs(d, exist_ok=True)
    data = os.urandom(size)
    times = []
    for i in range(files):
        t = time.perf_counter()
        with open(f"{d}/f{i}.pt", "wb") as f:
            f.write(data)
        times.append(time.perf_counter() - t)
    print(" ".join(f"{x:.6f}" for x in times))
"""


def write_config(state: Path, variant: str) -> Path:
    key = state / "site.key"
    if not key.exists():
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, os.urandom(32).hex().encode() + b"\n")
        os.close(fd)
    v = VARIANTS[variant]
    targets = ", ".join(f'"file://{state}/t{i}"' for i in range(K))
    for i in range(K):  # a store's root is the site's to make, never bootseer's
        (state / f"t{i}").mkdir(exist_ok=True)
    cfg = state / f"config-{variant}.toml"
    cfg.write_text(
        f'[site]\nkey_file = "{key}"\n'
        f'[paths]\ncache_dir = "{state}/cache"\n'
        f"[ckpt]\ntargets = [{targets}]\nunit_size = {UNIT}\n"
        f"quota_rescan = {v['rescan']}\n"
        f"[ckpt.quota]\nuser = {v['quota']}\n"
    )
    return cfg


def populate(state: Path, objects: int) -> None:
    """``objects`` small objects under the user's directory, as other checkpoints leave."""
    stores = [open_store(f"file://{state}/t{i}") for i in range(K)]
    for i in range(objects):
        stores[i % K].write_bytes(f"{USER}/old/units/v{i // 1000}/{i}", b"x" * 4096, atomic=False)


def cpu_seconds(pid: int) -> float:
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    fields = raw[raw.rfind(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(state: Path, variant: str, files: int, size: int) -> tuple[list[float], float]:
    """Per-close seconds of ``files`` saves through a fresh mount, and the daemon's CPU."""
    os.environ["BOOTSEER_CONFIG"] = str(write_config(state, variant))
    mp = ckpt_mount.prepare_mountpoint(state / "mnt", variant, 0, 0)
    rec = ckpt_mount.start(
        mp, f"{USER}/q-{variant}", 0, 0, state, node="", timeout=30,
        log_path=state / f"fuse-{variant}.log",
    )  # fmt: skip
    try:
        cpu0 = cpu_seconds(rec.pid)
        r = subprocess.run(
            ["/usr/bin/python3", "-c", textwrap.dedent(SAVER), f"{mp}/run", str(files), str(size)],
            capture_output=True,
            text=True,
            timeout=3600,
            check=True,
        )
        cpu = cpu_seconds(rec.pid) - cpu0
    finally:
        ckpt_mount.stop(rec)
    for i in range(K):  # the population stays what it was for the next run
        shutil.rmtree(state / f"t{i}" / USER / f"q-{variant}", ignore_errors=True)
    return [float(x) for x in r.stdout.split()], cpu


def count_seconds(state: Path, reps: int = 5) -> float:
    stores = [open_store(f"file://{state}/t{i}") for i in range(K)]
    guard = QuotaGuard(stores, [Scope("user", USER, 1 << 40, (USER,))], rescan=0.0)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        guard.usage(fresh=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def charge_seconds(state: Path, n: int = 100_000) -> float:
    """One charge and its landing with a fresh count (what each upload pays between
    counts), outside the mount."""
    stores = [open_store(f"file://{state}/t{i}") for i in range(K)]
    guard = QuotaGuard(stores, [Scope("user", USER, 1 << 40, (USER,))], rescan=1e9)
    guard.usage(fresh=True)
    t = time.perf_counter()
    for _ in range(n):
        guard.charge(4096, "bench")
        guard.landed(4096)
    return (time.perf_counter() - t) / n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--files", type=int, default=300, help="files saved per run")
    p.add_argument("--file-kib", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--population", type=int, default=1000, help="objects the user holds")
    p.add_argument("--smoke", action="store_true", help="50 files, 2 rounds, 1000 objects")
    add_state_and_out(p, "ckptq", "write <out>.json and <out>.txt")
    args = p.parse_args()
    if args.smoke:
        args.files, args.rounds, args.population = 50, 2, 1000
    state = args.state_dir
    return in_fresh_state(state, lambda: run(args, state))


def run(args: argparse.Namespace, state: Path) -> int:
    populate(state, args.population)
    names = list(VARIANTS)
    per_close: dict[str, list[float]] = {v: [] for v in names}
    medians: dict[str, list[float]] = {v: [] for v in names}
    cpu: dict[str, list[float]] = {v: [] for v in names}
    loads: list[float] = []
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for v in order:
            times, secs = one_run(state, v, args.files, args.file_kib << 10)
            per_close[v] += times
            medians[v].append(statistics.median(times))
            cpu[v].append(secs / args.files)
            loads.append(os.getloadavg()[0])
            print(
                f"round {r + 1} {v:5}: median close {statistics.median(times) * 1e3:.2f} ms, "
                f"daemon CPU {secs / args.files * 1e3:.2f} ms/file, load {loads[-1]:.1f}",
                flush=True,
            )
    count = count_seconds(state)
    charge = charge_seconds(state)
    base = statistics.median(per_close["off"])
    lines = [
        f"{args.files} files of {args.file_kib} KiB per run, {args.rounds} rounds, "
        f"K={K} file:// targets, the user holding {args.population} objects; "
        f"load average {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores",
        f"one count of the user's directory (outside the mount): {count * 1e3:.1f} ms; "
        f"one charge between counts: {charge * 1e6:.1f} us",
        "variant  median ms/close  - off   x off   daemon CPU ms/file",
    ]
    result: dict[str, Any] = {
        "files": args.files,
        "file_kib": args.file_kib,
        "rounds": args.rounds,
        "population": args.population,
        "count_ms": count * 1e3,
        "charge_us": charge * 1e6,
        "load": [min(loads), max(loads)],
        "variants": {},
    }
    for v in names:
        med = statistics.median(per_close[v])
        c = statistics.median(cpu[v])
        diff = (med - base) * 1e3
        lines.append(f"{v:7}  {med * 1e3:15.2f}  {diff:+5.2f}  {med / base:5.2f}  {c * 1e3:18.2f}")
        result["variants"][v] = {
            "median_close_ms": med * 1e3,
            "round_medians_ms": [m * 1e3 for m in medians[v]],
            "daemon_cpu_ms_per_file": c * 1e3,
        }
    text = "\n".join(lines)
    write_results(args.out, result, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
