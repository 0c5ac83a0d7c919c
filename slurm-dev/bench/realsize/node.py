"""One node's part of the real-size benchmark (one task per node, as the job's user).

Each variant starts as a training job does: the container from its image (squashfuse, the
entry point ``start.py``), the dependencies, the checkpoint (every shard loaded with
``torch.load``: a data-parallel restart), the first step. Each is a phase mark, so
``bootseer report`` has every node's ready time. After the first step, outside the start,
the node measures what the table also needs (a second start, its own part of the
checkpoint, the floors). Every timing is a ``BENCH {json}`` line on stdout.

- ``record`` (``--bootseer=refresh``): image, install through ``bootseer deps run``, no
  checkpoint yet; after the first step the first node saves the checkpoint through the
  mount (``torch.save`` then ``fsync``, each shard).
- ``warm_setup``: installs the prefix on local disk (filling a local uv cache) and packs it
  with ``tar -I zstd`` (the restore's floor).
- ``warm``: the warm-node floor: image, prefix and checkpoint on local disk (the image and
  checkpoint are the bench's own files; page cache dropped with ``posix_fadvise(DONTNEED)``
  before each first read).
- ``fullcopy``: the image and checkpoint copied whole from the store host, a fresh install.
- ``bootseer``: ``$BOOTSEER_IMAGE``, ``bootseer deps run``, ``$BOOTSEER_CKPT``.
- ``deps_record``: only ``--bootseer-deps`` (no image: a base key of its own), the
  install through ``bootseer deps run``: the snapshot ``restore_alone`` restores.
- ``restore_alone``: the same options on a cold node: the prolog's restore with nothing
  beside it (no image prefetch, no checkpoint mount); the job's first step is empty.
- ``image_alone``: only ``--bootseer-image`` on a cold node: the container's start
  through the mount after the prolog's prefetch, with no restore or checkpoint warm-up
  beside it.

``BENCH_TRAIN_S`` (``profile.py --train``): that many seconds of "training" after the
first step, reading nothing, before the rest (the agent's background fill runs then).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # slurm-dev/bench/

from measure import drop_pages

E = os.environ
VARIANT = E["BENCH_VARIANT"]
LOCAL = Path(E["BENCH_LOCAL"])
WORK = Path(E["BENCH_DIR"])
NODE = E.get("SLURMD_NODENAME", os.uname().nodename)
RANK = int(E.get("SLURM_NODEID", "0"))
NNODES = int(E.get("SLURM_JOB_NUM_NODES", "1"))
SHARDS = [f"shard{i:02d}.pt" for i in range(int(E["BENCH_SHARDS"]))]
TAR_REPS = int(E["BENCH_TAR_REPS"])


def emit(key: str, t0: float, t1: float, nbytes: int, **more: object) -> None:
    rec = {"node": NODE, "key": key, "t0": t0, "t1": t1, "bytes": nbytes, **more}
    print("BENCH " + json.dumps(rec), flush=True)


def mark(*args: str) -> None:
    subprocess.run(["bootseer", "phase", *args], check=True, stdout=subprocess.DEVNULL)


def discard(path: Path) -> None:
    """Set a tree aside in LOCAL/.trash (a rename); the bench deletes it between points and
    lets the freed inodes settle (bench.py's ``SETTLE_S``: ext4 without a journal makes
    every file created soon after a mass delete scan past the freed inodes)."""
    if not path.exists():
        return
    trash = LOCAL / ".trash"
    trash.mkdir(exist_ok=True)
    path.rename(trash / f"{path.name}.{time.monotonic_ns()}")


def rchar(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


def resident(path: Path) -> int:
    """Bytes of ``path`` in the page cache (util-linux ``fincore``; -1 if it cannot say).

    It cannot say for a file the job's user neither owns nor may write (the bench's own
    image, the warm floor's): for such a file the kernel's ``mincore``, which ``fincore``
    asks, reports every page resident whatever the page cache holds (a guard against
    page cache side channels), so every floor read "cached" in full."""
    st = path.stat()
    if st.st_uid != os.geteuid() and not os.access(path, os.W_OK):
        return -1
    r = subprocess.run(
        ["fincore", "--bytes", "--raw", "--noheadings", "-o", "RES", str(path)],
        capture_output=True,
        text=True,
    )
    return int(r.stdout.split()[0]) if r.returncode == 0 and r.stdout.split() else -1


def agent_reads() -> int:
    """The node agent's count of image reads that reached it (-1 without an agent)."""
    sock = E.get("BOOTSEER_AGENT_SOCKET")
    if not sock:
        return -1
    try:
        from bootseer.agentapi.client import AgentClient
        from bootseer.agentapi.jobs import Stats

        return AgentClient(sock).ask(Stats(), timeout=5).read_requests
    except Exception:  # a measurement, not the start: never fail the job for it
        return -1


def container(image: Path, key: str) -> None:
    """Mount the image with squashfuse and run its entry point; the bytes are what
    squashfuse read of the image file. The record also says how much of the image file
    the page cache held before (``cached``) and how many reads reached the node agent
    during the start (``agent_reads``; -1 for a local file)."""
    cached, reads0 = resident(image), agent_reads()
    mnt = Path(tempfile.mkdtemp(prefix="realsize-"))
    fuse = subprocess.Popen(["squashfuse", "-f", str(image), str(mnt)])
    try:
        t_end = time.monotonic() + 120
        while not os.path.ismount(mnt):
            if fuse.poll() is not None or time.monotonic() > t_end:
                raise SystemExit(f"squashfuse {image} did not mount ({fuse.poll()})")
            time.sleep(0.05)
        t0 = time.time()
        subprocess.run([E["BENCH_PY"], str(mnt / "app" / "start.py")], check=True)
        t1 = time.time()
        reads = agent_reads()
        emit(
            key,
            t0,
            t1,
            rchar(fuse.pid),
            cached=cached,
            agent_reads=reads - reads0 if reads >= 0 and reads0 >= 0 else -1,
        )
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False)
        fuse.wait(timeout=60)
        mnt.rmdir()


def install_cmd(prefix: Path, cache: str | None = None, offline: bool = False) -> str:
    uv, py = E["BENCH_UV"], E["BENCH_PY"]
    cache_env = f"UV_CACHE_DIR={cache}" if cache else "UV_CACHE_DIR=$(mktemp -d)"
    flags = "--offline" if offline else "" if cache else "--no-cache"
    return (
        f"{uv} venv -q --python {py} {prefix} && {cache_env} {uv} pip install -q {flags} "
        f"--python {prefix}/bin/python --index-url {E['BENCH_INDEX']} -r {WORK}/requirements.txt"
    )


def tree_bytes(root: Path) -> int:
    return sum((Path(d) / f).lstat().st_size for d, _, files in os.walk(root) for f in files)


def load(dir_: Path, names: list[str], key: str, cold: bool, fetch: str = "") -> None:
    """``torch.load`` each file; with ``fetch`` (a URL prefix), each is copied from there
    first and removed after (a full copy, a shard's worth of disk at a time)."""
    import torch

    t0, n = time.time(), 0
    for name in names:
        if fetch:
            subprocess.run(["curl", "-sSf", "-o", str(dir_ / name), f"{fetch}/{name}"], check=True)
        elif cold:
            drop_pages(dir_ / name)
        state = torch.load(dir_ / name, weights_only=True)
        n += sum(t.numel() * t.element_size() for t in state.values())
        del state
        if fetch:
            (dir_ / name).unlink()
    emit(key, t0, time.time(), n, files=len(names))


def save(dest: Path, key: str) -> None:
    """The checkpoint saved as training saves it: ``torch.save`` of each shard's tensors
    (read from the bench's copy, mapped), then ``fsync``."""
    import torch

    t0, n = time.time(), 0
    for name in SHARDS:
        state = torch.load(WORK / "ckpt" / name, weights_only=True, mmap=True)
        with open(dest / name, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        n += (dest / name).stat().st_size
        del state
    emit(key, t0, time.time(), n, files=len(SHARDS))


def first_step(prefix: Path) -> None:
    mark("start", "first_step")
    subprocess.run(
        [str(prefix / "bin" / "python"), "-c", "import " + E["BENCH_IMPORTS"].replace(":", ", ")],
        check=True,
    )
    mark("end", "first_step")


def warm_setup() -> None:
    prefix = LOCAL / "env"
    discard(prefix)
    subprocess.run(["sh", "-c", install_cmd(prefix, cache=str(LOCAL / "uvcache"))], check=True)
    subprocess.run(
        ["tar", "-I", "zstd", "-cf", str(LOCAL / "prefix.tar.zst"), "-C", str(prefix), "."],
        check=True,
    )
    emit("prefix", 0, 0, tree_bytes(prefix))


def my_part() -> list[str]:
    return [s for i, s in enumerate(SHARDS) if i % NNODES == RANK]


def main() -> None:
    LOCAL.mkdir(parents=True, exist_ok=True)
    if VARIANT == "warm_setup":
        warm_setup()
        return
    if VARIANT in ("deps_record", "restore_alone", "image_alone"):  # one technique alone
        if VARIANT == "deps_record":
            cmd = install_cmd(LOCAL / "boot-env")
            subprocess.run(["bootseer", "deps", "run", "--", "sh", "-c", cmd], check=True)
        elif VARIANT == "image_alone":
            mark("start", "container_start")
            container(Path(E["BOOTSEER_IMAGE"]), "start")
            mark("end", "container_start")
        mark("start", "first_step")  # empty: the report's start ends here
        mark("end", "first_step")
        return
    full = LOCAL / "full"
    if VARIANT == "warm":
        # The bench's own copies: on this node's local disk, as the warm node's would be.
        image, prefix, ckpt = WORK / "image.sqsh", LOCAL / "env", WORK / "ckpt"
        drop_pages(image)
    elif VARIANT == "fullcopy":
        discard(full)
        (full / "ckpt").mkdir(parents=True)
        image, prefix, ckpt = full / "image.sqsh", full / "env", full / "ckpt"
        mark("start", "image_pull")
        subprocess.run(
            ["curl", "-sSf", "-o", str(image), f"{E['BENCH_HTTP']}/image.sqsh"], check=True
        )
        mark("end", "image_pull", "--bytes", str(image.stat().st_size))
    else:
        image, prefix = Path(E["BOOTSEER_IMAGE"]), LOCAL / "boot-env"
        ckpt = Path(E.get("BOOTSEER_CKPT", "/nonexistent"))

    mark("start", "container_start")
    container(image, "start")
    mark("end", "container_start")

    if VARIANT in ("record", "bootseer"):
        subprocess.run(
            ["bootseer", "deps", "run", "--", "sh", "-c", install_cmd(prefix)], check=True
        )
    elif VARIANT == "fullcopy":
        subprocess.run(
            ["bootseer", "phase", "run", "deps_install", "--", "sh", "-c", install_cmd(prefix)],
            check=True,
        )
    if not (prefix / "bin" / "python").exists():
        raise SystemExit(f"no environment at {prefix}")

    if VARIANT != "record":
        mark("start", "ckpt_load")
        fetch = f"{E['BENCH_HTTP']}/ckpt" if VARIANT == "fullcopy" else ""
        load(ckpt, SHARDS, "ckpt_all", cold=True, fetch=fetch)
        mark("end", "ckpt_load")
    first_step(prefix)
    print(f"BENCH ready {NODE}", flush=True)
    time.sleep(float(E.get("BENCH_TRAIN_S", "0")))  # training: the image's fill runs

    # -- after the start: what the table needs besides -------------------------------------
    if VARIANT == "record":
        if RANK == 0:
            save(ckpt, "ckpt_save")
        return
    if VARIANT == "fullcopy":
        discard(full)
        return
    container(image, "restart")  # the same image again: re-reads (page cache)
    load(ckpt, my_part(), "ckpt_part", cold=True)
    if VARIANT == "warm":
        scratch = LOCAL / "scratch"
        discard(scratch)
        scratch.mkdir()
        try:
            if RANK == 0:
                save(scratch, "ckpt_save")
                shutil.rmtree(scratch)
                scratch.mkdir()
            archive = LOCAL / "prefix.tar.zst"
            for rep in range(TAR_REPS):  # the restore's floor, steadier as a median
                scratch.mkdir(exist_ok=True)
                drop_pages(archive)
                t0 = time.time()
                subprocess.run(
                    ["tar", "-I", "zstd", "-xf", str(archive), "-C", str(scratch)], check=True
                )
                emit("tar", t0, time.time(), tree_bytes(scratch), rep=rep)
                discard(scratch)
            cmd = install_cmd(scratch, cache=str(LOCAL / "uvcache"), offline=True)
            t0 = time.time()
            subprocess.run(["sh", "-c", cmd], check=True)
            emit("uv_warm", t0, time.time(), tree_bytes(scratch))
        finally:
            discard(scratch)


if __name__ == "__main__":
    sys.exit(main())
