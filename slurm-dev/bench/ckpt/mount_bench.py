"""Checkpoint reads and writes through the FUSE mount against the same on local disk.

Issue 19, item 3: at real sizes (GBs), each workload runs once on a directory of the
local disk (the floor) and once through a checkpoint mount whose K = 3 targets are
directories of the same disk, alternating (local, mount, mount, local, ...):

- ``write_seq``: ``open(wb)`` and 1 MiB writes front to back, then ``fsync`` (dd-like);
- ``write_files``: the same bytes as 8 files written in turn (a checkpoint of shards);
- ``write_torch``: ``torch.save`` of a state dict of 16 MiB float32 tensors, then ``fsync``;
- ``read_seq``: the sequential file read back whole in 1 MiB reads (cold: the local
  file's and the targets' pages are dropped from the page cache first);
- ``read_torch``: ``torch.load`` of the saved state dict (cold as well);
- ``read_part``: a quarter of the sequential file from its middle, in 4 MiB ``pread``s
  (what one rank of a sharded, DCP-style load reads);
- ``read_part_paced``: the same part, with a 4 ms pause after each ``pread`` (a loader
  that copies each piece into its tensors before asking for the next: about 1 GB/s, so
  the targets keep ahead of it).

Reported per workload: MB/s (median), the mount/local ratio, and the daemon's CPU
seconds per GiB (user + system of the daemon process and its threads, from /proc):
the figure the machine's load moves least. The load average is recorded beside. After
each read through the mount, what the page cache holds (``mincore``) of the targets'
unit files and of the mount's file: a node that holds the checkpoint's bytes twice
(the targets' pages beside the mount's) shows here.

    $BOOTSEER_VENV/bin/python slurm-dev/bench/ckpt/mount_bench.py --smoke
    $BOOTSEER_VENV/bin/python slurm-dev/bench/ckpt/mount_bench.py --size-mib 2048 --reps 3 \\
        --out slurm-dev/bench/ckpt/results-mount-2GiB

``--before REV`` adds a mount served by that revision's daemon (from a ``git archive`` of
its ``lib``), alternating with the others. Runs as root (FUSE). Mounts, daemons and data
under ``--state-dir`` are removed at the end, even on failure. Disk: ``--size-mib`` at a
time (each file is removed once read).
"""

from __future__ import annotations

import argparse
import contextlib
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

from write_bench import cpu_seconds, write_config  # noqa: E402

from benchrun import add_state_and_out, in_fresh_state, write_results  # noqa: E402
from bootseer.ckpt import mount as ckpt_mount  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30

WORK: dict[str, str] = {
    "write_seq": """
        import os, sys, time
        size, path = int(sys.argv[1]), sys.argv[2]
        chunk = os.urandom(1 << 20)
        t = time.perf_counter()
        with open(path, "wb") as f:
            for _ in range(size >> 20):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        print(time.perf_counter() - t, size)
    """,
    "write_files": """
        import os, sys, time
        size, path = int(sys.argv[1]), sys.argv[2]
        chunk = os.urandom(1 << 20)
        files, mib = 8, size // 8 >> 20
        t = time.perf_counter()
        os.mkdir(path)
        for i in range(files):
            with open(os.path.join(path, f"shard{i}.bin"), "wb") as f:
                for _ in range(mib):
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
        print(time.perf_counter() - t, files * mib << 20)
    """,
    "write_torch": """
        import os, sys, time, torch
        size, path = int(sys.argv[1]), sys.argv[2]
        per = 16 << 20
        state = {f"layer{i}": torch.rand(per // 4) for i in range(max(1, size // per))}
        t = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        print(time.perf_counter() - t, os.path.getsize(path))
    """,
    "read_seq": """
        import os, sys, time
        size, path = int(sys.argv[1]), sys.argv[2]
        buf = bytearray(1 << 20)
        n = 0
        t = time.perf_counter()
        with open(path, "rb", buffering=0) as f:
            while got := f.readinto(buf):
                n += got
        print(time.perf_counter() - t, n)
    """,
    "read_torch": """
        import os, sys, time, torch
        size, path = int(sys.argv[1]), sys.argv[2]
        t = time.perf_counter()
        state = torch.load(path, weights_only=True)
        n = sum(v.numel() * v.element_size() for v in state.values())
        print(time.perf_counter() - t, os.path.getsize(path))
    """,
    "read_part": """
        import os, sys, time
        size, path = int(sys.argv[1]), sys.argv[2]
        part = size // 4
        buf = bytearray(4 << 20)
        n = 0
        t = time.perf_counter()
        fd = os.open(path, os.O_RDONLY)
        try:
            off = size // 2 - part // 2
            while n < part:
                got = os.preadv(fd, [buf], off + n)
                if not got:
                    break
                n += got
        finally:
            os.close(fd)
        print(time.perf_counter() - t, n)
    """,
}
WORK["read_part_paced"] = WORK["read_part"].replace(
    "n += got\n", "n += got\n                time.sleep(0.004)\n"
)
FILES = {"write_seq": "seq.bin", "write_files": "shards", "write_torch": "model.pt"}
READS = {
    "read_seq": "seq.bin",
    "read_torch": "model.pt",
    "read_part_paced": "seq.bin",
    "read_part": "seq.bin",  # the last read of seq.bin: the file is removed after it
}


@contextlib.contextmanager
def mounted(state: Path, variant: str, lib: str | None) -> Iterator[tuple[Path, int]]:
    """A fresh mount served by this tree's daemon, or (``lib``) by the one in that
    ``lib`` directory (an earlier tree's, first on the daemon's PYTHONPATH)."""
    mp = ckpt_mount.prepare_mountpoint(state / "mnt", variant, 0, 0)
    old = os.environ.get("PYTHONPATH")
    if lib:
        os.environ["PYTHONPATH"] = lib
    try:
        rec = ckpt_mount.start(
            mp, f"root/bench-{variant}", 0, 0, state, node="", timeout=60,
            log_path=state / f"fuse-{variant}.log",
        )  # fmt: skip
    finally:
        if lib:
            if old is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = old
    try:
        yield mp, rec.pid
    finally:
        ckpt_mount.stop(rec)


def before_lib(state: Path, rev: str) -> str:
    """Revision ``rev``'s ``lib`` (a ``git archive`` of it under ``state``), for
    :func:`mounted`: a daemon of that tree."""
    archive = subprocess.run(
        ["git", "-C", str(TOP), "archive", rev, "lib"], capture_output=True, check=True
    ).stdout
    (state / "before").mkdir()
    subprocess.run(["tar", "-x", "-C", str(state / "before")], input=archive, check=True)
    return str(state / "before" / "lib")


def drop_cache(root: Path, sync: bool = True) -> None:
    """Drop the clean page cache of every file under ``root`` (the local file, the targets'
    units, the mount's own): a read that follows is cold, as on a node that did not write
    the checkpoint."""
    for dirpath, _, names in os.walk(root):
        for name in names:
            p = os.path.join(dirpath, name)
            try:
                fd = os.open(p, os.O_RDONLY)
            except OSError:
                continue
            try:
                if sync:
                    os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass
            finally:
                os.close(fd)


def resident_bytes(path: Path) -> int:
    """Bytes of the file ``path`` in the page cache (``mincore`` of a private mapping,
    which reads nothing itself); 0 for an empty file."""
    import ctypes
    import mmap

    size = os.stat(path).st_size
    if size == 0:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    pages = -(-size // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as f:
        # Private and writable (never written): ctypes takes its address.
        m = mmap.mmap(
            f.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
        )
        try:
            addr = ctypes.c_char.from_buffer(m)
            try:
                if libc.mincore(ctypes.byref(addr), ctypes.c_size_t(size), vec) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore {path}")
            finally:
                del addr
        finally:
            m.close()
    return sum(mmap.PAGESIZE for v in vec if v & 1)


def tree_resident(root: Path) -> int:
    """:func:`resident_bytes` summed over the files under ``root``."""
    total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            with contextlib.suppress(OSError):
                total += resident_bytes(Path(dirpath) / name)
    return total


def storage_read(pid: int) -> int:
    """Bytes process ``pid`` has read from storage so far (``/proc/<pid>/io``
    ``read_bytes``): with ``file://`` targets read past the page cache (``O_DIRECT``), the
    unit bytes the daemon fetched, read-ahead included."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == "read_bytes":
            return int(value)
    return 0


def settled(pid: int, quiet: float = 0.3, timeout: float = 10.0) -> None:
    """Wait until the daemon has read nothing more from storage for ``quiet`` seconds:
    read-ahead still on its way when the reader exits is counted (bytes and CPU) with the
    read that asked for it, not with the next workload."""
    until = time.monotonic() + timeout
    last = storage_read(pid)
    while time.monotonic() < until:
        time.sleep(quiet)
        now = storage_read(pid)
        if now == last:
            return
        last = now


def s3_targets(cfg: Path, site: Path) -> str:
    """Point ``cfg``'s checkpoint targets at three buckets of ``site``'s S3 store."""
    import tomllib

    store = tomllib.loads(site.read_text())["store"]
    secrets = store.get("secrets_file") or str(site.parent / "secrets.toml")
    base, _, query = store["uri"].partition("?")
    targets = ", ".join(f'"{base}-ckptm/t{i}?{query}"' for i in range(3))
    text = cfg.read_text().replace("[ckpt]\ntargets = [", f"[ckpt]\ntargets = [{targets}] #", 1)
    cfg.write_text(text + f'[store]\nuri = "{store["uri"]}"\nsecrets_file = "{secrets}"\n')
    return f"3 x S3 buckets of {base} (SeaweedFS)"


def run_one(python: str, work: str, size: int, path: Path) -> tuple[float, int]:
    r = subprocess.run(
        [python, "-c", textwrap.dedent(WORK[work]), str(size), str(path)],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if r.returncode != 0:
        raise SystemExit(f"{work} on {path}: {r.stderr.strip()[-400:]}")
    secs, n = r.stdout.split()[-2:]
    return float(secs), int(n)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--size-mib", type=int, default=2048)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="64 MiB, 1 rep, no torch")
    p.add_argument("--torch-python", default=sys.executable, help="an interpreter with torch")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--before", default="", help="also a mount served by this git revision's daemon")
    p.add_argument(
        "--s3-site",
        type=Path,
        default=None,
        help="a slurm-dev site config (`slurm-dev/up --s3`): the targets are 3 buckets of its "
        "S3 store, written with its secrets file",
    )
    add_state_and_out(p, "ckptm", "write <out>.json and <out>.txt")
    args = p.parse_args()
    size = (64 if args.smoke else args.size_mib) * MiB
    reps = 1 if args.smoke else args.reps
    torch = not (args.smoke or args.no_torch)
    state = args.state_dir
    return in_fresh_state(state, lambda: run(args, state, size, reps, torch))


def run(args: argparse.Namespace, state: Path, size: int, reps: int, torch: bool) -> int:
    cfg = write_config(state)
    where = "3 x file:// on the local disk"
    if args.s3_site:
        where = s3_targets(cfg, args.s3_site)
    os.environ["BOOTSEER_CONFIG"] = str(cfg)
    works = ["write_seq", "read_seq", "read_part_paced", "read_part", "write_files"]
    if torch:
        works += ["write_torch", "read_torch"]
    libs: dict[str, str | None] = {"mount": None}
    if args.before:
        libs = {"before": before_lib(state, args.before), "mount": None}
    variants = ["local", *libs]
    secs: dict[str, dict[str, list[float]]] = {v: {w: [] for w in works} for v in variants}
    cpu: dict[str, dict[str, list[float]]] = {v: {w: [] for w in works} for v in libs}
    loads: dict[str, list[float]] = {v: [] for v in libs}
    # Unit bytes read from the targets per byte returned (file:// targets only).
    fetched: dict[str, dict[str, list[float]]] = {v: {w: [] for w in works} for v in libs}
    # Page cache held after each workload through the mount: the targets' units, the file.
    cached: dict[str, dict[str, list[dict[str, int]]]] = {v: {w: [] for w in works} for v in libs}
    nbytes: dict[str, int] = {}
    local = state / "local"
    for rep in range(reps):
        for variant in variants if rep % 2 == 0 else variants[::-1]:
            if variant == "local":
                local.mkdir(exist_ok=True)
                for w in works:
                    if w.startswith("read"):
                        drop_cache(local)
                    py = args.torch_python if "torch" in w else sys.executable
                    t, n = run_one(py, w, size, local / (FILES.get(w) or READS[w]))
                    secs["local"][w].append(t)
                    nbytes[w] = n
                    print(f"rep {rep} local {w:12} {n / t / 1e6:8.1f} MB/s", flush=True)
                    if w == "read_part":  # the disk holds one file of --size-mib at a time
                        (local / "seq.bin").unlink()
                    if w == "write_files":
                        shutil.rmtree(local / "shards")
                shutil.rmtree(local)
                continue
            with mounted(state, variant, libs[variant]) as (mp, pid):
                for w in works:
                    if w.startswith("read") and not args.s3_site:
                        drop_cache(state / "t0")
                        drop_cache(state / "t1")
                        drop_cache(state / "t2")
                        drop_cache(mp, sync=False)  # the mount's page cache (keep_cache)
                    py = args.torch_python if "torch" in w else sys.executable
                    path = mp / (FILES.get(w) or READS[w])
                    c0, r0 = cpu_seconds(pid), storage_read(pid)
                    t, n = run_one(py, w, size, path)
                    settled(pid)
                    c = cpu_seconds(pid) - c0
                    secs[variant][w].append(t)
                    cpu[variant][w].append(c / (n / GiB))
                    if w.startswith("read") and not args.s3_site:
                        fetched[variant][w].append((storage_read(pid) - r0) / n)
                    loads[variant].append(os.getloadavg()[0])
                    held = {
                        "targets": 0 if args.s3_site else tree_resident(state / "t0")
                        + tree_resident(state / "t1") + tree_resident(state / "t2"),
                        "mount": resident_bytes(path),
                    }  # fmt: skip
                    cached[variant][w].append(held)
                    print(
                        f"rep {rep} {variant} {w:12} {n / t / 1e6:8.1f} MB/s "
                        f"daemon {c / (n / GiB):.2f} CPU-s/GiB load1 {loads[variant][-1]:.1f} "
                        f"cached: targets {held['targets'] / MiB:.0f} MiB, "
                        f"mount {held['mount'] / MiB:.0f} MiB",
                        flush=True,
                    )
                    if w == "read_part":
                        (mp / "seq.bin").unlink()
                    if w == "write_files":
                        shutil.rmtree(mp / "shards")
                for name in set(FILES.values()):
                    if (mp / name).is_file():
                        (mp / name).unlink()
    med = {v: {w: statistics.median(x) for w, x in secs[v].items() if x} for v in secs}
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "size_bytes": size,
        "bytes": nbytes,
        "targets": where,
        "reps": reps,
        "before": args.before,
        "commit": subprocess.run(
            ["git", "-C", str(TOP), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "cpus": os.cpu_count(),
        "load1_median": {v: statistics.median(x) for v, x in loads.items() if x},
        "mb_s_median": {v: {w: nbytes[w] / s / 1e6 for w, s in med[v].items()} for v in med},
        "ratio_to_local": {v: {w: med["local"][w] / med[v][w] for w in works} for v in libs},
        "daemon_cpu_s_per_gib_median": {
            v: {w: statistics.median(x) for w, x in cpu[v].items() if x} for v in libs
        },
        "fetched_per_byte_read_median": {
            v: {w: statistics.median(x) for w, x in fetched[v].items() if x} for v in libs
        },
        "page_cache_after_mib_median": {
            v: {
                w: {k: statistics.median(h[k] for h in x) / MiB for k in ("targets", "mount")}
                for w, x in cached[v].items()
                if x
            }
            for v in libs
        },
        "secs": secs,
        "page_cache_after": cached,
        "daemon_cpu_s_per_gib": cpu,
        "fetched_per_byte_read": fetched,
    }
    lines = [
        f"{results['date']} UTC: {size // MiB} MiB, {results['targets']}, {reps} reps "
        f"alternating, medians; after = {results['commit']}"
        + (f", before = {args.before}" if args.before else "")
        + f"; {results['cpus']} cores, load1 median "
        + ", ".join(f"{v} {x:.1f}" for v, x in results["load1_median"].items()),
        f"{'workload':12} {'local MB/s':>11}"
        + "".join(
            f" {v + ' MB/s':>12} {'/local':>7} {'CPU-s/GiB':>10} {'fetched':>8}"
            f" {'tgt MiB':>8} {'mnt MiB':>8}"
            for v in libs
        ),
    ]
    for w in works:
        line = f"{w:12} {results['mb_s_median']['local'][w]:11.1f}"
        for v in libs:
            got = results["fetched_per_byte_read_median"][v].get(w)
            line += (
                f" {results['mb_s_median'][v][w]:12.1f} {results['ratio_to_local'][v][w]:7.2f}"
                f" {results['daemon_cpu_s_per_gib_median'][v][w]:10.2f}"
                + (f" {got:7.2f}x" if got is not None else f" {'-':>8}")
                + f" {results['page_cache_after_mib_median'][v][w]['targets']:8.0f}"
                f" {results['page_cache_after_mib_median'][v][w]['mount']:8.0f}"
            )
        lines.append(line)
    text = "\n".join(lines)
    write_results(args.out, results, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
