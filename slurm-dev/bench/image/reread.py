"""Re-reads of a job's image through the agent's mount against the page cache (issue 19).

The realsize bench's ``image_reread`` is a second start of a container in the same job:
squashfuse mounted again on the job's image file (the agent's FUSE file, its pages cached
by the first start) against the same start from a local image file whose pages are cached.
This bench takes that start apart on one node, with a real agent (``tests.imagekit``):

- ``start``: the container's start (realsize's ``start.py``: ``import torch`` from the
  image, ``libtorch_cpu.so`` and two CUDA-sized libraries read whole), squashfuse over
  the job's file, the second time (re-read), against squashfuse over the local file, the
  second time; each side's first start before it (the FUSE side's from the agent's warm
  block cache, every block local);
- ``replay``: squashfuse's own ``pread64`` calls on the image file during a re-read start
  (``strace``: offsets and sizes), replayed by one process on the job's file and on the
  local file, both cached: the gap without Python, squashfuse or the start's CPU;
- ``sequential``: the whole image read in 1 MiB reads, both cached.

For each it counts the FUSE requests the kernel sent while it ran (the ``fuse`` trace
events: reads reaching the agent, and any other request), checks with ``mincore`` that
every page of the job's file is still cached before the re-read, and with ``--perf DIR``
records ``perf record -a -g`` of the replay on each side. Rounds alternate which side
goes first; medians.

    python3 slurm-dev/bench/image/reread.py --label main --json OUT.json [--rounds 3]

As root. The image (about 1.6 GiB, uncompressed squashfs of this venv's torch tree) is
built once under ``--work`` and kept (``--clean`` removes it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
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
START = TOP / "slurm-dev" / "bench" / "realsize" / "start.py"
# What ``import torch`` loads from site-packages, and what realsize's mid image adds.
TREE = (
    "torch",
    "torchgen",
    "functorch",
    "numpy",
    "numpy.libs",
    "opt_einsum",
    "tqdm",
    "typing_extensions.py",
    "sympy",
    "mpmath",
    "networkx",
    "filelock",
    "fsspec",
    "jinja2",
    "markupsafe",
)
CUDA = (("libcublasLt.so.12", 400), ("libnccl.so.2", 220))
TRACING = Path("/sys/kernel/tracing")
UNCOMPRESSED = ("-noI", "-noD", "-noF", "-noX")  # as realsize's image: no CPU to unpack


# -- the image --------------------------------------------------------------------------------


def build_image(work: Path) -> Path:
    out = work / "reread.sqsh"
    if out.exists():
        return out
    root = work / "reread.root"
    shutil.rmtree(root, ignore_errors=True)
    src = Path(sysconfig.get_paths()["purelib"])
    dest = root / "site-packages"
    dest.mkdir(parents=True)
    for name in TREE:
        if (src / name).is_dir():
            shutil.copytree(src / name, dest / name, symlinks=True)
        elif (src / name).exists():
            shutil.copy2(src / name, dest / name)
    (root / "app").mkdir()
    (root / "cuda").mkdir()
    shutil.copy(START, root / "app" / "start.py")
    for name, mib in CUDA:
        with open(root / "cuda" / name, "wb") as f:
            for _ in range(mib):
                f.write(os.urandom(MIB))
    whole = ["site-packages/torch/lib/libtorch_cpu.so", *(f"cuda/{n}" for n, _ in CUDA)]
    (root / "app" / "read_whole.txt").write_text("\n".join(whole) + "\n")
    tmp = out.with_suffix(".tmp")
    subprocess.run(
        ["mksquashfs", str(root), str(tmp), "-noappend", "-quiet", "-no-progress", *UNCOMPRESSED],
        check=True,
    )
    tmp.chmod(0o644)
    os.replace(tmp, out)
    shutil.rmtree(root)
    return out


# -- measuring --------------------------------------------------------------------------------


def cached_pages(path: Path) -> tuple[int, int]:
    """(bytes of ``path`` in the page cache, its size): util-linux ``fincore``."""
    r = subprocess.run(
        ["fincore", "--bytes", "--raw", "--noheadings", "-o", "RES,SIZE", str(path)],
        check=True,
        capture_output=True,
        text=True,
    )
    res, size = r.stdout.split()
    return int(res), int(size)


class FuseEvents:
    """The FUSE requests the kernel sends while a block runs (``fuse:fuse_request_send``
    in a tracing instance of our own: nothing of another tracer's is touched)."""

    def __init__(self, mount: Path) -> None:
        self.inst = TRACING / "instances" / f"bootseer-reread-{os.getpid()}"
        self.connection = os.minor(os.stat(mount).st_dev)  # the agent's mount only

    def __enter__(self) -> FuseEvents:
        self.inst.mkdir()
        event = self.inst / "events" / "fuse" / "fuse_request_send"
        (self.inst / "buffer_size_kb").write_text("8192")
        (event / "filter").write_text(f"connection == {self.connection}")
        (event / "enable").write_text("1")
        return self

    def __exit__(self, *exc: object) -> None:
        (self.inst / "events" / "fuse" / "fuse_request_send" / "enable").write_text("0")
        self.inst.rmdir()

    @contextlib.contextmanager
    def count(self, into: dict[str, int]) -> Iterator[None]:
        (self.inst / "trace").write_text("")
        (self.inst / "tracing_on").write_text("1")
        try:
            yield
        finally:
            (self.inst / "tracing_on").write_text("0")
            for line in (self.inst / "trace").read_text().splitlines():
                m = re.search(r"fuse_request_send:.* opcode \d+ \(FUSE_(\w+)\)", line)
                if m is not None:
                    into[m.group(1)] = into.get(m.group(1), 0) + 1


@contextlib.contextmanager
def squashfuse(
    image: Path, mnt: Path, strace: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    mnt.mkdir(exist_ok=True)
    cmd = ["squashfuse", "-f", str(image), str(mnt)]
    if strace is not None:
        cmd = ["strace", "-f", "-qq", "-e", "trace=pread64", "-o", str(strace), *cmd]
    proc = subprocess.Popen(cmd)
    try:
        deadline = time.monotonic() + 120
        while not os.path.ismount(mnt):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"squashfuse {image} did not mount ({proc.poll()})")
            time.sleep(0.02)
        yield proc
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False)
        proc.wait(timeout=60)


def start(image: Path, mnt: Path, strace: Path | None = None) -> float:
    with squashfuse(image, mnt, strace):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-S", str(mnt / "app" / "start.py")],
            check=True,
            env={**os.environ, "BENCH_START_IMPORTS": "torch"},
            stdout=subprocess.DEVNULL,
        )
        return time.perf_counter() - t0


def preads(strace: Path) -> list[tuple[int, int]]:
    """(offset, size) of each ``pread64`` of the image file (fd 3 onwards) in the trace."""
    out = []
    for line in strace.read_text().splitlines():
        m = re.search(r"pread64\((\d+), .*, (\d+), (\d+)\) = (\d+)", line)
        if m:
            out.append((int(m.group(3)), int(m.group(2))))
    return out


REPLAY = r"""
import os, sys, time
path, ops = sys.argv[1], sys.argv[2]
pairs = [tuple(map(int, l.split())) for l in open(ops)]
buf = bytearray(max(s for _, s in pairs))
fd = os.open(path, os.O_RDONLY)
mv = memoryview(buf)
t0 = time.perf_counter()
n = 0
for off, size in pairs:
    n += os.preadv(fd, [mv[:size]], off)
t = time.perf_counter() - t0
print(t, n)
"""


def replay(path: Path, ops: Path, perf: Path | None = None) -> float:
    cmd = [sys.executable, "-c", REPLAY, str(path), str(ops)]
    if perf is not None:
        cmd = ["perf", "record", "-q", "-a", "-g", "-o", str(perf), "--", *cmd]
    r = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return float(r.stdout.split()[0])


def sequential(path: Path) -> float:
    buf = bytearray(MIB)
    fd = os.open(path, os.O_RDONLY)
    t0 = time.perf_counter()
    try:
        while os.readv(fd, [buf]):
            pass
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def cpu_s(pid: int) -> float:
    """A process's CPU seconds (all its threads: utime + stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def packs_cached(agent: AgentProc) -> int:
    """Bytes of the agent's block cache (its packs) in the page cache."""
    return sum(cached_pages(p)[0] for p in (agent.cache / "packs").glob("*.pack"))


def pressure(gib: float) -> None:
    """What a job does between its starts, as far as the page cache goes: ``gib`` of
    memory taken and touched (``torch.load`` of a checkpoint), then given back."""
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"b = bytearray({int(gib * GIB)}); b[::4096] = b'x' * len(b[::4096])",
        ],
        check=True,
    )


# -- the run ----------------------------------------------------------------------------------


def run(base: Path, img: Path, args: argparse.Namespace) -> dict[str, Any]:
    res: dict[str, Any] = {"label": args.label, "image_bytes": img.stat().st_size, "rounds": []}
    with (
        running_agent(base, block_size_kib=256, fetch_timeout=30.0) as agent,
        FuseEvents(agent.mount) as ev,
    ):
        agent_pid = agent.proc.pid if agent.proc else 0
        warm = Path(agent.prepare(1, str(img))["path"])
        sequential(warm)  # every block into the agent's cache
        agent.release(1)
        mnt = base / "sq"
        for rnd in range(args.rounds):
            r: dict[str, Any] = {"round": rnd, "load1": os.getloadavg()[0]}
            job = Path(agent.prepare(100 + rnd, str(img))["path"])
            sides = ["fuse", "local"] if rnd % 2 == 0 else ["local", "fuse"]
            for side in sides:
                path = job if side == "fuse" else img
                if side == "local":
                    drop_pages(img)
                else:  # as a cold node's packs (written past the page cache): from disk
                    for pack in (agent.cache / "packs").glob("*.pack"):
                        drop_pages(pack)
                reqs: dict[str, int] = {}
                c0 = cpu_s(agent_pid)
                with ev.count(reqs):
                    r[f"{side}_first_start_s"] = start(path, mnt)
                r[f"{side}_first_start_requests"] = reqs
                r[f"{side}_first_start_agent_cpu_s"] = round(cpu_s(agent_pid) - c0, 2)
                if side == "fuse":
                    r["packs_cached_after_first_start"] = packs_cached(agent)
                if args.pressure_gib:
                    pressure(args.pressure_gib)
                r[f"{side}_cached_before_restart"] = cached_pages(path)[0]
                reqs = {}
                c0 = cpu_s(agent_pid)
                with ev.count(reqs):
                    r[f"{side}_restart_s"] = start(path, mnt)
                r[f"{side}_restart_requests"] = reqs
                r[f"{side}_restart_agent_cpu_s"] = round(cpu_s(agent_pid) - c0, 2)
                r[f"{side}_cached_after_restart"] = cached_pages(path)[0]
                # squashfuse's reads, under strace (its own timing is not the figure)
                trace = base / f"strace-{side}-{rnd}.txt"
                start(path, mnt, strace=trace)
                ops = preads(trace)
                opsfile = base / f"ops-{side}-{rnd}.txt"
                opsfile.write_text("".join(f"{o} {s}\n" for o, s in ops))
                r[f"{side}_preads"] = len(ops)
                r[f"{side}_pread_bytes"] = sum(s for _, s in ops)
                sizes: dict[int, int] = {}
                for _, s in ops:
                    sizes[s] = sizes.get(s, 0) + 1
                r[f"{side}_pread_sizes_top"] = sorted(sizes.items(), key=lambda kv: -kv[1])[:8]
            # the same preads (the local side's list) replayed on each file, both cached
            ops = base / f"ops-local-{rnd}.txt"
            for side in sides:
                path = job if side == "fuse" else img
                replay(path, ops)  # warm
                reqs = {}
                with ev.count(reqs):
                    perf = args.perf / f"{args.label}-{side}-{rnd}.data" if args.perf else None
                    r[f"{side}_replay_s"] = replay(path, ops, perf)
                r[f"{side}_replay_requests"] = reqs
                sequential(path)  # every page cached (the replay's list is not all of it)
                reqs = {}
                with ev.count(reqs):
                    r[f"{side}_sequential_s"] = sequential(path)
                r[f"{side}_sequential_requests"] = reqs
            agent.release(100 + rnd)
            res["rounds"].append(r)
            print(json.dumps(r), flush=True)
        res["agent_pid"] = agent_pid
    rs = res["rounds"]
    for key in ("restart", "replay", "sequential"):
        f = statistics.median(x[f"fuse_{key}_s"] for x in rs)
        loc = statistics.median(x[f"local_{key}_s"] for x in rs)
        res[key] = {
            "fuse_s": round(f, 4),
            "local_s": round(loc, 4),
            "speed_vs_floor": round(loc / f, 3),
        }
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", default="run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--perf", type=Path, help="perf record -a -g of each replay, into this dir")
    ap.add_argument(
        "--pressure-gib", type=float, default=0.0, help="memory taken between the two starts"
    )
    ap.add_argument(
        "--lib", type=Path, help="the agent runs this tree's lib/ (another commit's, to compare)"
    )
    ap.add_argument("--clean", action="store_true", help="remove the kept image and stop")
    ap.add_argument(
        "--work",
        type=Path,
        default=Path(os.environ.get("BOOTSEER_TEST_STATE", "/var/tmp")) / "reread-bench",
    )
    args = ap.parse_args()
    if args.clean:
        shutil.rmtree(args.work, ignore_errors=True)
        return
    args.work.mkdir(parents=True, exist_ok=True)
    if args.lib:  # the agent's process (tests.imagekit passes the environment on)
        os.environ["PYTHONPATH"] = str(args.lib.resolve())
    if args.perf:
        args.perf.mkdir(parents=True, exist_ok=True)
    img = build_image(args.work)
    base = Path(tempfile.mkdtemp(prefix="run-", dir=args.work))
    base.chmod(0o755)
    try:
        out = run(base, img, args)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    summary = {k: out[k] for k in ("label", "image_bytes", "restart", "replay", "sequential")}
    print(json.dumps(summary))
    if args.json:
        old = json.loads(args.json.read_text()) if args.json.exists() else []
        args.json.write_text(json.dumps([*old, out], indent=1) + "\n")


if __name__ == "__main__":
    main()
