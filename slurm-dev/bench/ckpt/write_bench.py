"""Checkpoint writes through the FUSE mount: this tree against an earlier one (issue 12).

The same savers write the same bytes through a fresh mount of each variant, alternating
(before, after, after, before, ...), so both meet the same machine load:

- ``seq``: ``open(wb)`` and 1 MiB writes front to back (what ``torch.save`` does to a path);
- ``np.save``: one float32 array;
- ``safetensors``: ``safetensors.numpy.save_file`` (ftruncate to the final size, one
  write from offset 0, rename of the still-open temporary file);
- ``torch.save``: a state dict of float32 tensors, with ``--torch-python`` (an
  interpreter with torch CPU; the project's venv has none).

"before" is the daemon of ``--before`` (default: main before the write patterns landed),
run from a ``git archive`` of its ``lib`` through ``PYTHONPATH``; "after" is this tree.
Targets are K = 3 directories on the local disk, so the figures are the mount's own cost,
not a network's. Reported: medians of MB/s per saver and variant, after/before ratios,
the load average during each variant, and the savers a variant fails (safetensors gave
EIO before). Every file written is read back and checked against its SHA-256.

    $BOOTSEER_VENV/bin/python slurm-dev/bench/ckpt/write_bench.py --smoke       # CI-sized
    $BOOTSEER_VENV/bin/python slurm-dev/bench/ckpt/write_bench.py --size-mib 512 --reps 5 \\
        --torch-python /var/tmp/torch-venv/bin/python

Runs as root (FUSE). Mounts, daemons and data under ``--state-dir`` are removed at the
end, even on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TOP = HERE.parents[2]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(TOP / "lib"))

from benchrun import add_state_and_out, in_fresh_state, write_results  # noqa: E402
from bootseer.ckpt import mount as ckpt_mount  # noqa: E402

MiB = 1 << 20
BEFORE = "85eb561"  # main before issue 12's write patterns (safetensors: EIO)
UNIT = 8 * MiB

SAVERS: dict[str, str] = {
    "seq": """
        import os, sys, time
        size, path = int(sys.argv[1]), sys.argv[2]
        chunk = os.urandom(1 << 20)
        t = time.perf_counter()
        with open(path, "wb") as f:
            for _ in range(size >> 20):
                f.write(chunk)
        print(time.perf_counter() - t)
    """,
    "np.save": """
        import sys, time, numpy as np
        size, path = int(sys.argv[1]), sys.argv[2]
        a = np.random.default_rng(1).random(size // 4, dtype=np.float32)
        t = time.perf_counter()
        np.save(path, a)
        print(time.perf_counter() - t)
    """,
    "safetensors": """
        import sys, time, numpy as np
        from safetensors.numpy import save_file
        size, path = int(sys.argv[1]), sys.argv[2]
        a = np.random.default_rng(1).random(size // 4, dtype=np.float32)
        t = time.perf_counter()
        save_file({"w": a}, path)
        print(time.perf_counter() - t)
    """,
    "torch.save": """
        import sys, time, torch
        size, path = int(sys.argv[1]), sys.argv[2]
        per = 16 << 20
        state = {f"layer{i}": torch.rand(per // 4) for i in range(max(1, size // per))}
        t = time.perf_counter()
        torch.save(state, path)
        print(time.perf_counter() - t)
    """,
}
FILE = {"seq": "seq.bin", "np.save": "a.npy", "safetensors": "m.safetensors", "torch.save": "m.pt"}


def write_config(state: Path) -> Path:
    key = state / "site.key"
    if not key.exists():
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, os.urandom(32).hex().encode() + b"\n")
        os.close(fd)
    targets = ", ".join(f'"file://{state}/t{i}"' for i in range(3))
    for i in range(3):  # a store's root is the site's to make, never bootseer's
        (state / f"t{i}").mkdir(exist_ok=True)
    cfg = state / "config.toml"
    cfg.write_text(
        f'[site]\nkey_file = "{key}"\n'
        f'[paths]\ncache_dir = "{state}/cache"\n'
        f"[ckpt]\ntargets = [{targets}]\nunit_size = {UNIT}\n"
    )
    return cfg


@contextlib.contextmanager
def mounted(state: Path, variant: str, pythonpath: str | None) -> Iterator[tuple[Path, int]]:
    root = state / "mnt"
    mp = ckpt_mount.prepare_mountpoint(root, variant, 0, 0)
    env = os.environ.copy()
    old = os.environ.get("PYTHONPATH")
    daemon = ckpt_mount.DAEMON_MODULE
    if pythonpath:
        # The older daemon, through a shim that drops the arguments it does not know.
        os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), pythonpath])
        ckpt_mount.DAEMON_MODULE = "before_daemon"
    try:
        rec = ckpt_mount.start(
            mp, f"root/bench-{variant}", 0, 0, state, node="", timeout=30,
            log_path=state / f"fuse-{variant}.log",
        )  # fmt: skip
    except BaseException:
        ckpt_mount.DAEMON_MODULE = daemon
        raise
    finally:
        os.environ.clear()
        os.environ.update(env)
        if old is not None:
            os.environ["PYTHONPATH"] = old
    try:
        yield mp, rec.pid
    finally:
        try:
            ckpt_mount.stop(rec)  # knows its daemon by the module in its command line
        finally:
            ckpt_mount.DAEMON_MODULE = daemon


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far."""
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    fields = raw[raw.rfind(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 * MiB):
            h.update(chunk)
    return h.hexdigest()


def run_saver(python: str, saver: str, size: int, path: Path) -> tuple[float | None, str]:
    r = subprocess.run(
        [python, "-c", textwrap.dedent(SAVERS[saver]), str(size), str(path)],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or ["?"])[-1][:200]
    return float(r.stdout.split()[-1]), ""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--size-mib", type=int, default=256)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="32 MiB, 2 reps")
    p.add_argument("--before", default=BEFORE, help="the git revision to compare against")
    p.add_argument("--torch-python", default="", help="an interpreter with torch (CPU)")
    p.add_argument("--sync", action="store_true", help="sync(2) before each save")
    p.add_argument(
        "--savers", default="", help=f"comma-separated, of {', '.join(SAVERS)} (default: all)"
    )
    add_state_and_out(p, "ckptw", "write <out>.json and <out>.txt")
    args = p.parse_args()
    size = (32 if args.smoke else args.size_mib) * MiB
    reps = 2 if args.smoke else args.reps
    state = args.state_dir
    return in_fresh_state(state, lambda: run(args, state, size, reps))


def run(args: argparse.Namespace, state: Path, size: int, reps: int) -> int:
    os.environ["BOOTSEER_CONFIG"] = str(write_config(state))
    before_lib = state / "before"
    before_lib.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(TOP), "archive", args.before, "lib"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(before_lib)], input=archive, check=True)
    savers = ["seq", "np.save", "safetensors"] + (["torch.save"] if args.torch_python else [])
    if args.savers:
        savers = [s for s in args.savers.split(",") if s]
        unknown = [s for s in savers if s not in SAVERS]
        if unknown or ("torch.save" in savers and not args.torch_python):
            sys.exit(f"--savers: unknown {unknown} or torch.save without --torch-python")
    variants = {"before": str(before_lib / "lib"), "after": None}
    secs: dict[str, dict[str, list[float]]] = {v: {s: [] for s in savers} for v in variants}
    cpu: dict[str, dict[str, list[float]]] = {v: {s: [] for s in savers} for v in variants}
    fails: dict[str, dict[str, str]] = {v: {} for v in variants}
    loads: dict[str, list[float]] = {v: [] for v in variants}
    for rep in range(reps):
        order = ["before", "after"] if rep % 2 == 0 else ["after", "before"]
        for variant in order:
            with mounted(state, variant, variants[variant]) as (mp, pid):
                for saver in savers:
                    python = args.torch_python if saver == "torch.save" else sys.executable
                    path = mp / FILE[saver]
                    if args.sync:
                        # What the previous saver left dirty (its targets' units, the read-back
                        # copy) is written out now, not during this save.
                        os.sync()
                    c0 = cpu_seconds(pid)
                    t, err = run_saver(python, saver, size, path)
                    # The daemon's CPU per GB written: what the machine's load moves least.
                    cpu[variant][saver].append((cpu_seconds(pid) - c0) / (size / 1e9))
                    loads[variant].append(os.getloadavg()[0])
                    if t is None:
                        fails[variant][saver] = err
                        continue
                    # What was written is what is read back (a fresh open, whole file).
                    staged = state / "copy"
                    shutil.copyfile(path, staged)
                    if sha256_of(staged) != sha256_of(path):
                        fails[variant][saver] = "read back differs"
                        continue
                    staged.unlink()
                    secs[variant][saver].append(t)
                    print(
                        f"rep {rep} {variant:6} {saver:12} {size / t / 1e6:8.1f} MB/s", flush=True
                    )
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "size_bytes": size,
        "unit_size": UNIT,
        "targets": "3 x file:// on the local disk",
        "reps": reps,
        "before": args.before,
        "after": subprocess.run(
            ["git", "-C", str(TOP), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "cpus": os.cpu_count(),
        "load_avg_median": {v: statistics.median(loads[v]) for v in variants if loads[v]},
        "mb_s_median": {
            v: {s: size / statistics.median(x) / 1e6 for s, x in secs[v].items() if x}
            for v in variants
        },
        "daemon_cpu_s_per_gb_median": {
            v: {s: statistics.median(x) for s, x in cpu[v].items() if x and secs[v][s]}
            for v in variants
        },
        "secs": secs,
        "daemon_cpu_s_per_gb": cpu,
        "failures": fails,
    }
    lines = [
        f"{results['date']} UTC: {size // MiB} MiB per save, {UNIT // MiB} MiB units, "
        f"{results['targets']}, {reps} reps alternating, medians; "
        f"before = {args.before}, after = {results['after']}; {results['cpus']} cores, "
        f"load average median before {results['load_avg_median'].get('before', 0):.1f}, "
        f"after {results['load_avg_median'].get('after', 0):.1f}",
        f"{'saver':12} {'before MB/s':>12} {'after MB/s':>11} {'after/before':>13}"
        f" {'daemon CPU s/GB before':>23} {'after':>6}",
    ]
    for s in savers:
        b = results["mb_s_median"]["before"].get(s)
        a = results["mb_s_median"]["after"].get(s)
        cb = results["daemon_cpu_s_per_gb_median"]["before"].get(s)
        ca = results["daemon_cpu_s_per_gb_median"]["after"].get(s)
        bs = f"{b:12.1f}" if b else f"{'fails':>12}"
        as_ = f"{a:11.1f}" if a else f"{'fails':>11}"
        ratio = f"{a / b:13.2f}" if a and b else f"{'-':>13}"
        cbs = f"{cb:23.2f}" if cb is not None else f"{'-':>23}"
        cas = f"{ca:6.2f}" if ca is not None else f"{'-':>6}"
        lines.append(f"{s:12} {bs} {as_} {ratio} {cbs} {cas}")
    for v in variants:
        for s, err in fails[v].items():
            lines.append(f"{v} {s}: {err}")
    text = "\n".join(lines)
    write_results(args.out, results, text)
    # The smoke run's check: every saver works after, and is read back byte for byte.
    return 1 if fails["after"] else 0


if __name__ == "__main__":
    sys.exit(main())
