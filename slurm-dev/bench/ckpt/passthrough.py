"""What FUSE passthrough would give a mount's reads: one file read through a FUSE mount
whose daemon answers every read, through the same mount with the kernel reading a
backing file itself (``FOPEN_PASSTHROUGH``), and the backing file read directly (issue 19).

The checkpoint mount and the image mount are pyfuse3 daemons: every read of a page not
in the mount's page cache is a request the daemon answers with a copy of the bytes
(docs/ckpt.md: 1.1-1.2 CPU-s per GiB for the daemon, half of it the kernel's copy of the
replies into FUSE's page cache; realsize: 0.41-0.49x a local disk's reads). Linux 6.9+
can serve an open file's reads from a backing file with no daemon round trip, but
libfuse 3.14 and pyfuse3 do not speak that part of the protocol. This bench does, with
a small daemon of its own (``Daemon``: INIT with ``FUSE_PASSTHROUGH``, the backing file
registered by ``FUSE_DEV_IOC_BACKING_OPEN``, its id in the open reply), so the gain can be
measured before the mounts are built on it. Variants, alternated per rep, each on a fresh
mount with the backing file's page cache dropped first (``--cache warm``: then read once,
as units a node just fetched and wrote; ``--busy N``: N processes spin through the run):

- ``local``: the backing file itself, read directly;
- ``pyfuse3``: the same file served by a pyfuse3 daemon (the library both mounts use, the
  checkpoint mount's options, ``max_tasks=64``), its reads answered by ``os.pread``;
- ``served``: the mount, this bench's own daemon answering each read request (``pread``
  + ``writev``; the checkpoint mount's 4 MiB read-ahead, so 1 MiB requests);
- ``passthrough``: the mount, the open file passed through to the backing file.

Then, on a mount of its own, the kernel's rule for one file opened both ways: a passthrough
open while a served one is open, and the reverse (``io_modes``: what the second opener
got, and what the same open gets once the first is closed).

Readers (each in a fresh process): ``seq``, 1 MiB ``readinto`` from start to end; ``mmap``,
the file mapped and every page touched. Reported per variant: MiB/s, the reader's and
the daemon's CPU seconds per GiB, the read requests the daemon answered, load1.

    $BOOTSEER_VENV/bin/python slurm-dev/bench/ckpt/passthrough.py --size-mib 2048 --reps 5 \\
        --out slurm-dev/bench/ckpt/results-passthrough-2GiB

Runs as root (a FUSE mount made with mount(2), the backing-file ioctl needs
CAP_SYS_ADMIN). Everything under ``--state-dir`` is removed at the end, even on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import fcntl
import json
import os
import statistics
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[2] / "lib"))

from measure import drop_pages, proc_cpu  # noqa: E402

from benchrun import add_state_and_out, in_fresh_state, write_results  # noqa: E402
from bootseer.mounts import set_read_ahead  # noqa: E402

GiB = 1 << 30
MiB = 1 << 20
VARIANTS = ("local", "pyfuse3", "served", "passthrough")
READERS = ("seq", "mmap")

# The FUSE protocol (include/uapi/linux/fuse.h, 7.40+), only what one read-only file needs.
IN_HEADER = struct.Struct("<IIQQIIIHH")  # len opcode unique nodeid uid gid pid extlen pad
OUT_HEADER = struct.Struct("<IiQ")  # len error unique
INIT_IN = struct.Struct("<IIIII")  # major minor max_readahead flags flags2 (then unused)
INIT_OUT = struct.Struct("<IIIIHHIIHHII24x")  # ... flags2 max_stack_depth, unused[6]
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr, 88 bytes
ENTRY_OUT = struct.Struct("<QQQQII")  # nodeid generation entry_valid attr_valid nsecs
ATTR_OUT = struct.Struct("<QII")  # attr_valid attr_valid_nsec dummy
OPEN_OUT = struct.Struct("<QIi")  # fh open_flags backing_id
READ_IN = struct.Struct("<QQII")  # fh offset size read_flags
BACKING_MAP = struct.Struct("<iIQ")  # fd flags padding
LOOKUP, FORGET, GETATTR, OPEN, READ, STATFS, RELEASE = 1, 2, 3, 14, 15, 17, 18
FLUSH, INIT, OPENDIR, READDIR, RELEASEDIR, INTERRUPT, BATCH_FORGET = 25, 26, 27, 28, 29, 36, 42
FUSE_ASYNC_READ, FUSE_BIG_WRITES, FUSE_MAX_PAGES, FUSE_INIT_EXT = 1, 1 << 5, 1 << 22, 1 << 30
FUSE_PASSTHROUGH_FLAGS2 = 1 << (37 - 32)
FOPEN_PASSTHROUGH = 1 << 7
FUSE_DEV_IOC_BACKING_OPEN = (1 << 30) | (BACKING_MAP.size << 16) | (229 << 8) | 1
ROOT, FILE = 1, 2
NAME = b"data"
MAX_PAGES = 256  # 1 MiB requests at most
READ_AHEAD_KIB = 4096  # the checkpoint mount's (``[ckpt] kernel_read_ahead_kb``)


class Daemon:
    """A FUSE file system of one read-only file, ``data``, backed by ``backing``: each
    open served by this process (``s``) or passed through to the backing file (``p``),
    in the order ``plan`` gives (its last answer for every open after)."""

    def __init__(self, dev: int, backing: str, plan: str) -> None:
        if not plan or set(plan) - {"s", "p"}:
            raise ValueError(f"plan {plan!r}: a string of s (served) and p (passthrough)")
        self.dev, self.plan, self.opens = dev, plan, 0
        self.passthrough = "p" in plan
        self.backing = os.open(backing, os.O_RDONLY)
        self.size = os.fstat(self.backing).st_size
        self.backing_id = -1
        self.reads = 0

    def attr(self, node: int) -> bytes:
        if node == ROOT:
            return ATTR.pack(ROOT, 0, 0, 0, 0, 0, 0, 0, 0, 0o40755, 2, 0, 0, 0, 4096, 0)
        blocks = (self.size + 511) // 512
        return ATTR.pack(FILE, self.size, blocks, 0, 0, 0, 0, 0, 0, 0o100444, 1, 0, 0, 0, 4096, 0)

    def reply(self, unique: int, *parts: bytes, error: int = 0) -> None:
        body = sum(len(p) for p in parts)
        with contextlib.suppress(FileNotFoundError):  # the request was interrupted
            os.writev(self.dev, [OUT_HEADER.pack(OUT_HEADER.size + body, -error, unique), *parts])

    def serve(self) -> None:
        buf = bytearray(MAX_PAGES * 4096 + 64 * 1024)
        while True:
            try:
                n = os.readv(self.dev, [buf])
            except OSError as exc:
                if exc.errno == errno.ENODEV:  # unmounted
                    return
                if exc.errno in (errno.EINTR, errno.EAGAIN, errno.ENOENT):
                    continue
                raise
            self.handle(memoryview(buf)[:n])

    def handle(self, req: memoryview) -> None:
        _len, op, unique, node, *_ = IN_HEADER.unpack_from(req)
        arg = req[IN_HEADER.size :]
        if op in (FORGET, BATCH_FORGET, INTERRUPT):
            return
        if op == INIT:
            _major, minor, readahead, flags, flags2 = INIT_IN.unpack_from(arg)
            flags_out = FUSE_ASYNC_READ | FUSE_BIG_WRITES | FUSE_MAX_PAGES | FUSE_INIT_EXT
            flags2_out = FUSE_PASSTHROUGH_FLAGS2 if self.passthrough else 0
            if not flags & FUSE_INIT_EXT or not flags2 & FUSE_PASSTHROUGH_FLAGS2:
                flags2_out = 0  # the kernel has no passthrough: the opens will fail below
            out = INIT_OUT.pack(
                7, minor, readahead, flags & flags_out, 16, 12, MAX_PAGES * 4096, 1,
                MAX_PAGES, 0, flags2_out, 1,
            )  # fmt: skip
            self.reply(unique, out)
        elif op == LOOKUP:
            name = bytes(arg).split(b"\0", 1)[0]
            if node != ROOT or name != NAME:
                self.reply(unique, error=errno.ENOENT)
            else:
                self.reply(unique, ENTRY_OUT.pack(FILE, 0, 3600, 3600, 0, 0), self.attr(FILE))
        elif op == GETATTR:
            self.reply(unique, ATTR_OUT.pack(3600, 0, 0), self.attr(node))
        elif op == OPEN:
            answer = self.plan[min(self.opens, len(self.plan) - 1)]
            self.opens += 1
            if answer == "s":
                self.reply(unique, OPEN_OUT.pack(0, 0, 0))
                return
            if self.backing_id < 0:  # once: the connection allows it only after INIT
                m = bytearray(BACKING_MAP.pack(self.backing, 0, 0))
                try:
                    self.backing_id = fcntl.ioctl(self.dev, FUSE_DEV_IOC_BACKING_OPEN, m)
                except OSError as exc:
                    self.reply(unique, error=exc.errno or errno.EIO)
                    return
            self.reply(unique, OPEN_OUT.pack(0, FOPEN_PASSTHROUGH, self.backing_id))
        elif op == READ:
            _fh, offset, size, _flags = READ_IN.unpack_from(arg)
            self.reads += 1
            self.reply(unique, os.pread(self.backing, size, offset))
        elif op == OPENDIR:
            self.reply(unique, OPEN_OUT.pack(0, 0, 0))
        elif op in (READDIR, RELEASE, RELEASEDIR, FLUSH):  # an empty directory; nothing kept
            self.reply(unique)
        elif op == STATFS:
            self.reply(unique, bytes(80))
        else:
            self.reply(unique, error=errno.ENOSYS)


def mount_fuse(mnt: Path) -> int:
    """/dev/fuse opened and mounted at ``mnt`` (read-only, every user may read)."""
    dev = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    libc = ctypes.CDLL(None, use_errno=True)
    opts = f"fd={dev},rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions"
    flags = 1 | 2 | 4  # MS_RDONLY | MS_NOSUID | MS_NODEV
    if libc.mount(b"bsprobe", str(mnt).encode(), b"fuse.bsprobe", flags, opts.encode()) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {mnt}: {os.strerror(e)}")
    return dev


PYFUSE3 = """
    import errno, os, stat, sys
    import pyfuse3, trio
    mnt, backing = sys.argv[1], sys.argv[2]
    fd = os.open(backing, os.O_RDONLY)
    size = os.fstat(fd).st_size

    class One(pyfuse3.Operations):
        reads = 0

        async def getattr(self, inode, ctx=None):
            a = pyfuse3.EntryAttributes()
            a.st_ino = inode
            root = inode == pyfuse3.ROOT_INODE
            a.st_mode = (stat.S_IFDIR | 0o755) if root else (stat.S_IFREG | 0o444)
            a.st_size = 0 if root else size
            a.attr_timeout = a.entry_timeout = 3600
            return a

        async def lookup(self, parent, name, ctx=None):
            if parent != pyfuse3.ROOT_INODE or name != b"data":
                raise pyfuse3.FUSEError(errno.ENOENT)
            return await self.getattr(2)

        async def open(self, inode, flags, ctx):
            return pyfuse3.FileInfo(fh=inode)

        async def read(self, fh, off, n):
            self.reads += 1
            return os.pread(fd, n, off)

    fs = One()
    opts = {"fsname=bsprobe", "default_permissions", "allow_other", "nosuid", "nodev", "noatime"}
    pyfuse3.init(fs, mnt, opts | {"ro"})
    print("mounted", flush=True)

    async def main():
        await pyfuse3.main(max_tasks=64)

    try:
        trio.run(main)
    finally:
        pyfuse3.close(unmount=False)
    print(fs.reads, flush=True)
"""

SERVE = """
    import os, sys
    sys.path.insert(0, sys.argv[1])
    from passthrough import Daemon, mount_fuse
    from pathlib import Path
    dev = mount_fuse(Path(sys.argv[2]))
    d = Daemon(dev, sys.argv[3], sys.argv[4])
    print("mounted", flush=True)
    d.serve()
    print(d.reads, flush=True)
"""

READER = """
    import mmap, os, resource, sys, time
    path, how = sys.argv[1], sys.argv[2]
    r0, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    total = 0
    with open(path, "rb", buffering=0) as f:
        if how == "seq":
            buf = bytearray(1 << 20)
            while n := f.readinto(buf):
                total += n
        else:
            size = os.fstat(f.fileno()).st_size
            with mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as m:
                m.madvise(mmap.MADV_SEQUENTIAL)
                for off in range(0, size, 4096):
                    total += m[off] >= 0
                total = size
    t, r1 = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF)
    print(t, r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, total)
"""


# The bench's own daemon: how it answers opens, in order (Daemon's plan).
PLANS = {"served": "s", "passthrough": "p"}


@contextlib.contextmanager
def served(
    state: Path, backing: Path, variant: str, plan: str = ""
) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """A fresh mount of ``backing`` by a daemon in its own process (pyfuse3's, or the
    bench's own answering opens by ``plan``, by default the variant's); unmounted (and
    the daemon stopped) on the way out, whatever happened."""
    mnt = state / f"mnt-{variant}"
    mnt.mkdir(exist_ok=True)
    if variant == "pyfuse3":
        cmd = [sys.executable, "-c", textwrap.dedent(PYFUSE3), str(mnt), str(backing)]
    else:
        cmd = [
            sys.executable,
            "-c",
            textwrap.dedent(SERVE),
            str(HERE),
            str(mnt),
            str(backing),
            plan or PLANS[variant],
        ]
    daemon = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert daemon.stdout is not None
        if daemon.stdout.readline().strip() != "mounted":
            raise SystemExit(f"{variant}: the daemon did not mount (exit {daemon.wait()})")
        os.stat(mnt)  # answered after INIT, which resets the read-ahead
        if not set_read_ahead(mnt, READ_AHEAD_KIB):
            raise SystemExit(f"{variant}: could not set {mnt}'s read-ahead")
        yield mnt, daemon
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()


def read_once(path: Path, how: str) -> tuple[float, float, int]:
    """One read of ``path`` by ``how`` in a fresh process: seconds, its CPU, bytes."""
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(READER), str(path), how],
        capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    if r.returncode != 0:
        raise SystemExit(f"reading {path} ({how}): {r.stderr.strip()[-400:]}")
    secs, cpu, total = r.stdout.split()
    return float(secs), float(cpu), int(total)


def one(state: Path, backing: Path, variant: str, how: str, warm: bool) -> dict[str, float]:
    size = backing.stat().st_size
    drop_pages(backing)
    if warm:  # as units the node just fetched and wrote: the backing file's pages cached
        read_once(backing, "seq")
    if variant == "local":
        secs, cpu, total = read_once(backing, how)
        daemon_cpu, reads = 0.0, 0
    else:
        with served(state, backing, variant) as (mnt, daemon):
            c0 = proc_cpu(daemon.pid)
            secs, cpu, total = read_once(mnt / NAME.decode(), how)
            daemon_cpu = proc_cpu(daemon.pid) - c0
        assert daemon.stdout is not None
        reads = int(daemon.stdout.read().strip() or -1)
    if total != size:
        raise SystemExit(f"{variant} {how}: read {total} bytes of {size}")
    gib = size / GiB
    return {
        "mib_s": size / MiB / secs,
        "secs": secs,
        "reader_cpu_s_per_gib": cpu / gib,
        "daemon_cpu_s_per_gib": daemon_cpu / gib,
        "read_requests": reads,
        "load1": os.getloadavg()[0],
    }


MODES = """
    import errno, json, os, sys
    def tried(f):
        try:
            with open(f, "rb") as g:
                g.read(4096)
        except OSError as exc:
            return errno.errorcode.get(exc.errno, str(exc.errno))
        return "ok"
    path = sys.argv[1]
    first = open(path, "rb")
    first.read(4096)
    second = tried(path)
    first.close()
    print(json.dumps({"while_open": second, "after_close": tried(path)}))
"""


def io_modes(state: Path, backing: Path) -> dict[str, dict[str, str]]:
    """What the kernel does with an open answered the other way than one still open
    (served, then passthrough; and the reverse), and with the same open after that
    first one is closed: "ok" or the error the opener got."""
    out = {}
    for plan, name in (("sp", "passthrough_after_served"), ("ps", "served_after_passthrough")):
        with served(state, backing, "mixed", plan) as (mnt, _daemon):
            r = subprocess.run(
                [sys.executable, "-c", textwrap.dedent(MODES), str(mnt / NAME.decode())],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
        if r.returncode != 0:
            raise SystemExit(f"io modes ({plan}): {r.stderr.strip()[-400:]}")
        out[name] = json.loads(r.stdout)
    return out


def make_backing(path: Path, size: int) -> None:
    block = os.urandom(64 * MiB)
    with open(path, "wb") as f:
        left = size
        while left:
            left -= f.write(block[: min(left, len(block))])
        f.flush()
        os.fsync(f.fileno())


def table(results: dict[str, Any]) -> str:
    lines = [
        f"FUSE passthrough ({results['date']}, {results['size_mib']} MiB, backing file "
        f"{results['cache']}, {results['busy']} spinning, {results['reps']} reps alternated, "
        f"commit {results['commit']}, {os.cpu_count()} cores); medians",
        f"{'reader':6} {'variant':12} {'MiB/s':>8} {'x local':>8} {'reader CPU-s/GiB':>17} "
        f"{'daemon CPU-s/GiB':>17} {'reads':>7} {'load1':>6}",
    ]
    for how, by in results["median"].items():
        local = by["local"]["mib_s"]
        for v, m in by.items():
            lines.append(
                f"{how:6} {v:12} {m['mib_s']:8.0f} {m['mib_s'] / local:8.2f} "
                f"{m['reader_cpu_s_per_gib']:17.2f} {m['daemon_cpu_s_per_gib']:17.2f} "
                f"{m['read_requests']:7.0f} {m['load1']:6.1f}"
            )
    for name, got in results["io_modes"].items():
        lines.append(
            f"{name.replace('_', ' ')}: {got['while_open']} while the first is open, "
            f"{got['after_close']} after it closed"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mib", type=int, default=2048)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--readers", default=",".join(READERS))
    p.add_argument(
        "--cache", choices=("cold", "warm"), default="cold",
        help="the backing file's page cache before each read: dropped, or filled",
    )  # fmt: skip
    p.add_argument("--busy", type=int, default=0, help="processes that spin through the run")
    add_state_and_out(p, "passthrough", "write <OUT>.json and <OUT>.txt")
    args = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("passthrough.py runs as root (mount(2), FUSE_DEV_IOC_BACKING_OPEN)")
    readers = [r for r in args.readers.split(",") if r]
    if unknown := set(readers) - set(READERS):
        raise SystemExit(f"--readers: unknown {sorted(unknown)}; known: {', '.join(READERS)}")

    def run() -> int:
        state = args.state_dir
        backing = state / "backing"
        make_backing(backing, args.size_mib * MiB)
        with spinning(args.busy):
            return measure(args, state, backing, readers)

    return in_fresh_state(args.state_dir, run)


@contextlib.contextmanager
def spinning(n: int) -> Iterator[None]:
    """``n`` processes that burn CPU (a busy node) until the block ends, whatever happens."""
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in spin:
            p.kill()
            p.wait()


def measure(args: argparse.Namespace, state: Path, backing: Path, readers: list[str]) -> int:
    runs: dict[str, dict[str, list[dict[str, float]]]] = {
        how: {v: [] for v in VARIANTS} for how in readers
    }
    for rep in range(args.reps):
        order = VARIANTS if rep % 2 == 0 else VARIANTS[::-1]
        for how in readers:
            for v in order:
                r = one(state, backing, v, how, args.cache == "warm")
                runs[how][v].append(r)
                print(
                    f"rep {rep} {how:4} {v:11} " + " ".join(f"{k} {x:.2f}" for k, x in r.items()),
                    flush=True,
                )
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "size_mib": args.size_mib,
        "reps": args.reps,
        "cache": args.cache,
        "busy": args.busy,
        "kernel": os.uname().release,
        "commit": subprocess.run(
            ["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "median": {
            how: {
                v: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for v, rs in by.items()
            }
            for how, by in runs.items()
        },
        "runs": runs,
        "io_modes": io_modes(state, backing),
    }
    write_results(args.out, results, table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
