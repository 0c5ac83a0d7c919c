"""Image startup benchmark: full copy vs lazy loading vs lazy loading with trace prefetch.

A node starts a "container" from a squashfs image kept in the S3 store (SeaweedFS in
its own network namespace behind a capped link, as ``slurm-dev/up --s3`` makes it).
Startup is: mount the image with squashfuse, run Python from it, import the libraries
and take one model step. Compared in one run, each from a cold node cache:

- ``full``: copy the whole image to local disk (16 parallel ranged reads), then start;
- ``lazy``: start at once from the agent's lazy file, blocks fetched on first read
  (this run also records the trace);
- ``prefetch``: the agent first fetches the trace's hot blocks in parallel, then start.

Also: bytes fetched before the first step, the hot fraction of the image, and warm
FUSE read throughput against reading the same image from local disk.

    slurm-dev/bench/image/bench.py --smoke            # CI: a small stdlib image, no torch
    slurm-dev/bench/image/bench.py --rounds 3         # the full image (torch==2.13.0 CPU)
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TOP = HERE.parents[2]
sys.path.insert(0, str(TOP / "slurm-dev"))
sys.path.insert(0, str(TOP / "lib"))

import devcluster  # noqa: E402

from bootseer.agentapi.client import AgentClient  # noqa: E402
from bootseer.agentapi.errors import AgentUnavailable  # noqa: E402
from bootseer.image.manifest import upload_file  # noqa: E402
from bootseer.image.registry import tag_image  # noqa: E402
from bootseer.image.trace import trace_key  # noqa: E402
from bootseer.sitekey import load_keys  # noqa: E402
from bootseer.store import Store  # noqa: E402

# The bare interpreter binary on purpose: the container's Python takes its stdlib (and, in
# the full image, torch and friends) from the image through PYTHONHOME, and needs nothing of
# bootseer's venv. The venv's own python would read its pyvenv.cfg and put the venv's
# site-packages on sys.path even under PYTHONHOME, so the "container" would import from
# outside its image. Only stdlib and image code runs on it (bench.py itself runs on the venv).
PYTHON = os.path.realpath(sys.executable)
PYLIB = Path(sys.base_prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
WORK = Path(os.environ.get("BOOTSEER_BENCH_DIR", "/var/tmp/bootseer-image-bench"))

SMOKE_PROGRAM = """
import time; t0 = time.time()
import json, email.mime.text, http.client, decimal, sqlite3, asyncio, xml.dom.minidom
import unittest, argparse, logging.handlers, urllib.request, csv, statistics, fractions
x = [float(i) for i in range(10000)]
w = sum(a * 0.5 for a in x)  # the "model step"
print("STEP", time.time() - t0, flush=True)
"""

FULL_PROGRAM = """
import time; t0 = time.time()
import numpy, pandas, scipy.linalg, torch
m = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
torch.nn.functional.cross_entropy(m(x), y).backward()
opt.step()
print("STEP", time.time() - t0, flush=True)
"""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- images -------------------------------------------------------------------------


def mksquashfs(root: Path, out: Path) -> Path:
    tmp = out.with_suffix(".tmp")
    subprocess.run(
        [
            "nice",
            "mksquashfs",
            str(root),
            str(tmp),
            "-noappend",
            "-quiet",
            "-no-progress",
            "-comp",
            "zstd",
            "-Xcompression-level",
            "3",
        ],
        check=True,
    )
    os.replace(tmp, out)
    return out


def copy_stdlib(dest: Path) -> None:
    """The interpreter's standard library (no tests, no site-packages) as <dest>/python."""
    lib = dest / "python" / "lib"
    lib.mkdir(parents=True)
    shutil.copytree(
        PYLIB,
        lib / PYLIB.name,
        symlinks=True,
        ignore=shutil.ignore_patterns("site-packages", "test", "idlelib", "tkinter"),
    )
    (lib / PYLIB.name / "site-packages").mkdir()


def smoke_image() -> Path:
    out = WORK / "smoke.sqsh"
    if not out.exists():
        root = WORK / "smoke-root"
        shutil.rmtree(root, ignore_errors=True)
        copy_stdlib(root)
        mksquashfs(root, out)
    return out


def full_image() -> Path:
    """Python + torch==2.13.0 (CPU) and friends, on top of an OS base (/usr): >= 1 GiB."""
    out = WORK / "full.sqsh"
    if out.exists():
        return out
    env = WORK / "torchenv"
    if not (env / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        pkgs = ["torch==2.13.0", "numpy", "scipy", "pandas", "pyarrow", "scikit-learn"]
        subprocess.run([str(env / "bin" / "pip"), "install", "-q", *pkgs], check=True)
    root = WORK / "full-root"
    shutil.rmtree(root, ignore_errors=True)
    copy_stdlib(root)
    site = root / "python" / "lib" / PYLIB.name / "site-packages"
    site.rmdir()
    shutil.copytree(env / "lib" / PYLIB.name / "site-packages", site, symlinks=True)
    # What a container image also holds and startup never reads: the OS userland.
    for d in (
        "/usr/bin",
        "/usr/share",
        "/usr/include",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/gcc",
        "/usr/lib/llvm-14",
    ):
        if os.path.isdir(d):
            shutil.copytree(d, root / d.lstrip("/"), symlinks=True)
    return mksquashfs(root, out)


# -- the store host and the agent -----------------------------------------------------


@contextlib.contextmanager
def store_host(mbit: int, delay_ms: int, port_base: int) -> Iterator[devcluster.Cluster]:
    state = WORK / "storehost"
    shutil.rmtree(state, ignore_errors=True)
    host = devcluster.Cluster(
        devcluster.Settings(
            str(state),
            nodes=1,
            port_base=port_base,
            s3=True,
            store_mbit=mbit,
            store_delay_ms=delay_ms,
        )
    )
    for d in (host.etc, host.run, host.logs):
        d.mkdir(parents=True, exist_ok=True)
    try:
        host.store_host_up()
        yield host
    finally:
        host.store_host_down()


class Agent:
    def __init__(
        self, base: Path, store_uri: str, block_kib: int, parallel: int, secrets: Path
    ) -> None:
        self.base = base
        self.secrets = secrets  # the store host's credentials (root only)
        self.sock = base / "agent.sock"
        self.mount = base / "mnt"
        self.cache = base / "cache"
        self.config = base / "bench.toml"
        self.store_uri = store_uri
        self.block_kib = block_kib
        self.parallel = parallel
        self.client = AgentClient(self.sock)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, cold: bool, start_fraction: float = 1.0) -> None:
        if cold:
            shutil.rmtree(self.cache, ignore_errors=True)
        base = self.base
        self.config.write_text(
            f'[site]\nkey_file = "{base}/site.key"\n'
            f'[store]\nuri = "{self.store_uri}"\nsecrets_file = "{self.secrets}"\n'
            f'[paths]\nrun_dir = "{base}/run"\ncache_dir = "{base}/cache0"\n'
            f'log_dir = "{base}/log"\n'
            f'[image]\nsocket = "{self.sock}"\nmount_dir = "{self.mount}"\n'
            f'cache_dir = "{self.cache}"\nblock_size_kib = {self.block_kib}\n'
            f"prefetch_parallel = {self.parallel}\nhot_deadline = 600.0\nfetch_timeout = 120.0\n"
            f"hot_start_fraction = {start_fraction}\n"
        )
        code = "import sys; from bootseer.cli import main; sys.exit(main())"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, "agent", "--node", "bench"],
            env={**os.environ, "BOOTSEER_CONFIG": str(self.config)},
            stderr=subprocess.DEVNULL,
        )
        for _ in range(200):
            try:
                self.client.call("ping", timeout=1)
                return
            except AgentUnavailable:
                time.sleep(0.05)
        raise TimeoutError("agent did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        with open("/proc/self/mounts") as f:
            if any(line.split()[1] == str(self.mount) for line in f):
                subprocess.run(["fusermount3", "-u", "-z", str(self.mount)], check=False)


# -- one startup ------------------------------------------------------------------------


@contextlib.contextmanager
def squashfuse(image: str) -> Iterator[Path]:
    mnt = Path(tempfile.mkdtemp(prefix="bsim-sq-", dir=WORK))
    subprocess.run(["squashfuse", image, str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False)
        mnt.rmdir()


def start_container(image: str, program: str) -> float:
    """Mount, run the program from the image; returns when its first step is done."""
    with squashfuse(image) as mnt:
        env = {
            "PYTHONHOME": str(mnt / "python"),
            "PYTHONNOUSERSITE": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PATH": "/usr/bin:/bin",
            "OMP_NUM_THREADS": "1",
        }
        r = subprocess.run([PYTHON, "-c", program], env=env, capture_output=True, text=True)
        if r.returncode != 0 or "STEP" not in r.stdout:
            raise RuntimeError(f"startup failed: {r.stderr[-2000:]}")
    return time.monotonic()


def copy_whole(store: Store, key: str, dest: Path, parallel: int) -> int:
    """The baseline: the whole image to local disk before the start, in parallel ranges."""
    size = store.info(key).size  # type: ignore[union-attr]
    chunk = 8 << 20
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:

        def part(off: int) -> None:
            f = store.open_read(key)
            try:
                os.pwrite(fd, bytes(f.read_at(min(chunk, size - off), off)), off)
            finally:
                f.close()

        with cf.ThreadPoolExecutor(parallel) as pool:
            list(pool.map(part, range(0, size, chunk)))
    finally:
        os.close(fd)
    return size


def run_full(store: Store, program: str, parallel: int) -> dict[str, Any]:
    dest = WORK / "copied.sqsh"
    t0 = time.monotonic()
    size = copy_whole(store, "bench/image.sqsh", dest, parallel)
    t_copy = time.monotonic() - t0
    t1 = start_container(str(dest), program)
    dest.unlink()
    return {
        "first_step_s": t1 - t0,
        "copy_s": t_copy,
        "bytes_before_first_step": size,
        "bytes_incl_background": size,
    }


def run_lazy(
    agent: Agent, job: int, program: str, mode: str, start_fraction: float = 1.0
) -> dict[str, Any]:
    agent.start(cold=True, start_fraction=start_fraction)
    try:
        st0 = agent.client.call("stats")
        before = {
            "fetched_bytes": st0["fetched_bytes"],
            "needed": st0["demand_bytes"] + st0["prefetch_bytes"],
        }
        t0 = time.monotonic()
        prep = agent.client.call(
            "prepare",
            timeout=900,
            job_id=job,
            uid=0,
            gid=0,
            image="bench:1",
            mode=mode,
            deadline=800,
        )
        t_prep = time.monotonic() - t0
        t1 = start_container(prep["path"], program)
        agent.client.call("first_step", job_id=job)
        st = agent.client.call("stats")
        fetched = st["fetched_bytes"] - before["fetched_bytes"]
        needed = st["demand_bytes"] + st["prefetch_bytes"] - before["needed"]
        rel = agent.client.call("release", timeout=60, job_id=job)
        p = prep["prefetch"]
        return {
            "first_step_s": t1 - t0,
            "prepare_s": t_prep,
            "bytes_before_first_step": needed,
            "bytes_incl_background": fetched,
            "hot_blocks": p["hot_blocks"],
            "hot_bytes": p["hot_bytes"],
            "recorded_blocks": rel["recorded_blocks"],
            "trace": rel["trace"],
        }
    finally:
        agent.stop()


# -- warm reads --------------------------------------------------------------------------


def read_all(path: str, drop: bool) -> float:
    """MB/s reading ``path`` with 1 MiB reads (after dropping its page cache if ``drop``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if drop:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        t0 = time.monotonic()
        n = 0
        while chunk := os.read(fd, 1 << 20):
            n += len(chunk)
        return n / (time.monotonic() - t0) / 1e6
    finally:
        os.close(fd)


def drop_cache_files(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def warm_reads(agent: Agent, image: Path) -> dict[str, float]:
    """Read throughput once every block is local, against the original on local disk.

    ``fuse_first``: a fresh job file (new inode), each request answered by the agent;
    ``fuse_reread``: the same file again, from the kernel's page cache (keep_cache);
    ``*_cold``: after dropping the page cache of the original and of the cached blocks.
    """
    agent.start(cold=False)
    try:
        out: dict[str, float] = {}

        def fresh(job: int) -> str:
            return str(
                agent.client.call(
                    "prepare", timeout=900, job_id=job, uid=0, gid=0, image="bench:1", deadline=800
                )["path"]
            )

        read_all(fresh(900), drop=False)  # makes every block local
        path = fresh(901)
        out["fuse_first_MBps"] = read_all(path, drop=False)
        out["fuse_reread_MBps"] = read_all(path, drop=False)
        read_all(str(image), drop=False)
        out["local_warm_MBps"] = read_all(str(image), drop=False)
        out["local_cold_MBps"] = read_all(str(image), drop=True)
        drop_cache_files(agent.cache)
        out["fuse_first_cold_MBps"] = read_all(fresh(902), drop=False)
        for job in (900, 901, 902):
            agent.client.call("release", job_id=job)
        return out
    finally:
        agent.stop()


# -- main ------------------------------------------------------------------------------


def median(rows: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in rows))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="small stdlib image, one round (CI)")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--image", type=Path, help="use this squashfs instead of building one")
    p.add_argument("--store-mbit", type=int, default=200)
    p.add_argument("--store-delay-ms", type=int, default=0, help="needs netem in the kernel")
    p.add_argument("--block-size-kib", type=int, default=256)
    p.add_argument("--parallel", type=int, default=16)
    p.add_argument(
        "--port-base", type=int, default=int(os.environ.get("BOOTSEER_DEV_PORT_BASE", "18400")) + 50
    )
    p.add_argument("--out", type=Path, default=None, help="write results.json here")
    p.add_argument(
        "--stream-fraction",
        type=float,
        default=0.25,
        help="also run prefetch with hot_start_fraction=F (start once the first F of the "
        "trace is local); 1 skips it",
    )
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench: run as root (network namespace, FUSE)")
    # SIGTERM unwinds like Ctrl-C, so the store host, agent and mounts are cleaned up.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    WORK.mkdir(parents=True, exist_ok=True)
    rounds = args.rounds or (1 if args.smoke else 3)
    image = args.image or (smoke_image() if args.smoke else full_image())
    program = SMOKE_PROGRAM if args.smoke else FULL_PROGRAM
    size = image.stat().st_size
    log(
        f"image {image}: {size / 2**20:.0f} MiB; link {args.store_mbit} Mbit/s, "
        f"+{args.store_delay_ms} ms; blocks {args.block_size_kib} KiB; {rounds} rounds"
    )
    results: dict[str, Any] = {
        "image_bytes": size,
        "store_mbit": args.store_mbit,
        "store_delay_ms": args.store_delay_ms,
        "block_size_kib": args.block_size_kib,
        "rounds": rounds,
        "smoke": args.smoke,
    }
    base = Path(tempfile.mkdtemp(prefix="bsim-agent-", dir=WORK))
    # The agent trusts only records sealed with its site key (docs/security.md).
    fd = os.open(base / "site.key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32).hex().encode() + b"\n")
    os.close(fd)
    keys = load_keys(base / "site.key")
    with store_host(args.store_mbit, args.store_delay_ms, args.port_base) as host:
        store = host.open_store()
        t0 = time.monotonic()
        manifest = upload_file(store, str(image), args.block_size_kib << 10, parallel=8, keys=keys)
        tag_image(store, "bench:1", manifest, keys=keys)
        with open(image, "rb") as f, store.writer("bench/image.sqsh") as out:
            shutil.copyfileobj(f, out, 8 << 20)
        log(f"stored image and blocks in {time.monotonic() - t0:.1f}s")
        agent = Agent(base, host.store_uri(), args.block_size_kib, args.parallel, host.secrets_file)
        rows: dict[str, list[dict[str, Any]]] = {"full": [], "lazy": [], "prefetch": []}
        if args.stream_fraction < 1:
            rows["prefetch_stream"] = []
        try:
            for r in range(rounds):
                store.delete(trace_key(manifest.id, "root"))  # the jobs run as uid 0
                rows["lazy"].append(run_lazy(agent, 10 + r * 4, program, "refresh"))
                log(f"round {r + 1} lazy: {rows['lazy'][-1]}")
                rows["prefetch"].append(run_lazy(agent, 11 + r * 4, program, "on"))
                log(f"round {r + 1} prefetch: {rows['prefetch'][-1]}")
                if "prefetch_stream" in rows:
                    rows["prefetch_stream"].append(
                        run_lazy(agent, 12 + r * 4, program, "on", args.stream_fraction)
                    )
                    log(f"round {r + 1} prefetch_stream: {rows['prefetch_stream'][-1]}")
                rows["full"].append(run_full(store, program, args.parallel))
                log(f"round {r + 1} full: {rows['full'][-1]}")
            results["warm"] = warm_reads(agent, image)
        finally:
            agent.stop()
            shutil.rmtree(base, ignore_errors=True)
    results["runs"] = rows
    t = {k: median(v, "first_step_s") for k, v in rows.items()}
    hot = median(rows["prefetch"], "hot_bytes")
    w = results["warm"]
    results["summary"] = {
        "first_step_s": t,
        "bytes_before_first_step": {
            k: median(v, "bytes_before_first_step") for k, v in rows.items()
        },
        "bytes_incl_background": {k: median(v, "bytes_incl_background") for k, v in rows.items()},
        "hot_fraction": hot / size,
        "speedup_vs_full": t["full"] / t["prefetch"],
        "speedup_vs_lazy": t["lazy"] / t["prefetch"],
        "warm_fuse_vs_local": w["fuse_reread_MBps"] / w["local_warm_MBps"],
        "first_fuse_vs_local_warm": w["fuse_first_MBps"] / w["local_warm_MBps"],
        "first_fuse_vs_local_cold": w["fuse_first_cold_MBps"] / w["local_cold_MBps"],
    }
    s = results["summary"]
    print(json.dumps(results, indent=1) if args.out is None else "")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(
        f"image {size / 2**20:.0f} MiB, hot fraction {s['hot_fraction']:.1%}\n"
        f"time to first step (median of {rounds}): full copy {t['full']:.1f}s, lazy "
        f"{t['lazy']:.1f}s, prefetch {t['prefetch']:.1f}s\n"
        f"bytes fetched before the first step (demand + prefetch; with the background fill): "
        + ", ".join(
            f"{k} {v / 2**20:.0f} MiB ({s['bytes_incl_background'][k] / 2**20:.0f})"
            for k, v in s["bytes_before_first_step"].items()
        )
        + "\n"
        f"prefetch vs full copy: {s['speedup_vs_full']:.2f}x (target 5x); vs lazy: "
        f"{s['speedup_vs_lazy']:.2f}x (target 1.5x)\n"
        + (
            f"prefetch_stream (start at {args.stream_fraction:.0%} of the hot set): "
            f"{t['prefetch_stream']:.1f}s: {t['full'] / t['prefetch_stream']:.2f}x vs full, "
            f"{t['lazy'] / t['prefetch_stream']:.2f}x vs lazy\n"
            if "prefetch_stream" in t
            else ""
        )
        + f"warm FUSE re-read {w['fuse_reread_MBps']:.0f} MB/s vs local "
        f"{w['local_warm_MBps']:.0f} MB/s ({s['warm_fuse_vs_local']:.2f}; target 0.5); "
        f"FUSE first read {w['fuse_first_MBps']:.0f} MB/s ({s['first_fuse_vs_local_warm']:.2f}); "
        f"page caches dropped: FUSE {w['fuse_first_cold_MBps']:.0f} vs local "
        f"{w['local_cold_MBps']:.0f} MB/s ({s['first_fuse_vs_local_cold']:.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
