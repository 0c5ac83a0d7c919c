#!/usr/bin/env python3
"""Where bootseer's CPU goes in one cold N-node start, process by process (issue 19).

Runs only the real-size bench's ``bootseer`` point (``bench.py``: cold nodes, agents
restarted, caches and restored prefixes wiped) on inputs a ``bench.py`` run left in the
store (its image, snapshot and checkpoint; ``--work`` as that run's), and samples
bootseer's processes in the nodes' cgroups every 0.2 s (``/proc/PID/stat``): the agents,
the prologs and epilogs, the checkpoint daemons, and what they start (a restore's child
and ``tar``, run as the job's user). With ``--perf DIR`` it also
records ``perf record -a`` (97 Hz) over the point, and ``py-spy record`` of each
process it finds (``--py-spy PATH``), into DIR.

    slurm-dev/bench/realsize/profile.py --size mid --work /var/tmp/bootseer-realsize \\
        [--perf /var/tmp/prof --py-spy /opt/bootseer/venv/bin/py-spy]

``--train S`` keeps each node "training" S seconds after its first step (reading nothing),
so the agents' background fill has the time to run: with ``--train 120`` at mid size it
takes in the whole image.

Prints one line per process (node, CPU seconds over the point, command) and the bytes
each node's agent took in (its ``bootseer_p2p_bytes_total`` counters, from the store and
from peers) and served to peers, and CPU seconds per GiB taken in.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench as B  # noqa: E402
from benchkit import Proc, agent_metrics, bootseer_procs, dump_toml, read_proc  # noqa: E402


class Watch:
    """Bootseer's processes on the nodes (``benchkit.bootseer_procs``), their CPU seconds,
    and their profilers."""

    def __init__(self, b: B.Bench, nodes: list[str], out: Path | None, py_spy: str) -> None:
        self.b, self.nodes, self.out, self.py_spy = b, nodes, out, py_spy
        self.seen: dict[tuple[int, int], dict[str, object]] = {}
        self.known: set[tuple[int, int]] = set()
        self.spies: list[subprocess.Popen[bytes]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            for node in self.nodes:
                procs = [p for p in map(read_proc, self.b.cpu.pids(node)) if p is not None]
                for proc in bootseer_procs(procs, self.known):
                    self.sample(node, proc)
            self.stop.wait(0.2)

    def sample(self, node: str, proc: Proc) -> None:
        try:
            cmd = Path(f"/proc/{proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return
        key, cpu = (proc.pid, proc.started), proc.cpu_s
        rec = self.seen.setdefault(key, {"node": node, "cmd": cmd[:150], "cpu0": cpu, "cpu": cpu})
        rec["cpu"] = max(float(rec["cpu"]), cpu)  # type: ignore[arg-type]
        if len(rec) == 4 and self.out is not None and self.py_spy and "python" in cmd:
            rec["spy"] = True
            out = self.out / f"{node}-{proc.pid}-{proc.comm}.txt"
            self.spies.append(
                subprocess.Popen(
                    [
                        self.py_spy,
                        "record",
                        "-p",
                        str(proc.pid),
                        "-r",
                        "50",
                        "--nonblocking",
                        "-f",
                        "raw",
                        "-o",
                        str(out),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for s in self.spies:
            if s.poll() is None:
                s.send_signal(signal.SIGINT)
        for s in self.spies:
            with contextlib.suppress(subprocess.TimeoutExpired):
                s.wait(60)


def counters(b: B.Bench, node: str) -> dict[str, float]:
    """The node agent's counters the bench's story reads (``B.AGENT_COUNTERS``)."""
    m = agent_metrics(b.c.dir / "nodes" / node / "metrics" / "bootseer_agent.prom")
    return {k: m.get(name, 0.0) for k, name in B.AGENT_COUNTERS.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=["full", "mid", "smoke"], default="mid")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument(
        "--state-dir", default=os.environ.get("BOOTSEER_DEV_STATE", "/var/tmp/bootseer-dev")
    )
    p.add_argument("--work", type=Path, default=Path("/var/tmp/bootseer-realsize"))
    p.add_argument("--user", default=B.default_user())
    p.add_argument("--perf", type=Path, help="record perf -a and py-spy into this directory")
    p.add_argument("--py-spy", default="", help="py-spy's path (with --perf)")
    p.add_argument(
        "--run-kib",
        type=int,
        help="the agents' [image] prefetch_run_kib (0: the hot set block by block; "
        "default: the site's)",
    )
    p.add_argument(
        "--train",
        type=float,
        default=0.0,
        help="seconds each node trains (reads nothing) after its first step: the "
        "background fill's time (default 0: the bench's job as it is)",
    )
    args = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("profile: run as root")
    size = {"full": B.FULL, "mid": B.MID, "smoke": B.SMOKE}[args.size]
    work = args.work / size.name
    if not (work / "image.sqsh").exists():
        raise SystemExit(f"profile: no inputs under {work}: run bench.py --size {size.name} first")
    cluster = B.devcluster.Cluster.load(Path(args.state_dir))
    b = B.Bench(cluster, size, work, args.user)
    b.image, b.ckpt = work / "image.sqsh", work / "ckpt"
    b.train_s = args.train
    nodes = cluster.s.node_names[: args.nodes]
    perf = None
    try:
        b.cpu.adopt_cluster()
        b.site_config()
        if args.run_kib is not None:
            data = tomllib.loads(cluster.site_config.read_text())
            data.setdefault("image", {})["prefetch_run_kib"] = args.run_kib
            cluster.site_config.write_text(dump_toml(data, "profile.py --run-kib"))
        b.out.mkdir(exist_ok=True)
        b.out.chmod(0o1777)
        b.http_proc = cluster.serve_http(work, B.HTTP_PORT)
        b.cold(nodes)
        if args.perf:
            args.perf.mkdir(parents=True, exist_ok=True)
            perf = subprocess.Popen(
                ["perf", "record", "-a", "-F", "97", "-o", str(args.perf / "perf.data")],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        watch = Watch(b, nodes, args.perf, args.py_spy)
        watch.thread.start()
        try:
            pt = b.point("bootseer", nodes)
        finally:
            watch.close()
        B.log(f"job {pt.job}: startup {pt.startup_s:.1f}s, load {B.load1():.1f}")
        # Before the agents restart (their counters start again from 0).
        time.sleep(12)  # the agents write their metrics every 10 s
        got = {node: counters(b, node) for node in nodes}
    finally:
        if perf is not None:
            perf.send_signal(signal.SIGINT)
            perf.wait(120)
        B.stop_http(b.http_proc)
        b.restore_config()
        with contextlib.suppress(Exception):
            b.cold(nodes)
        b.cpu.release()
    total = 0.0
    for rec in sorted(watch.seen.values(), key=lambda r: -(float(r["cpu"]) - float(r["cpu0"]))):  # type: ignore[arg-type]
        cpu = float(rec["cpu"]) - float(rec["cpu0"])  # type: ignore[arg-type]
        total += cpu
        if cpu >= 0.05:
            print(f"{rec['node']}  {cpu:7.2f} CPU-s  {rec['cmd']}")
    taken = 0.0
    for node in nodes:
        c = got[node]
        taken += c["p2p_peer"] + c["p2p_store"]
        print(
            f"{node}: agent took in {c['p2p_store'] / B.GiB:.2f} GiB from the store, "
            f"{c['p2p_peer'] / B.GiB:.2f} GiB from peers; "
            f"served {c['served'] / B.GiB:.2f} GiB in {c['peer_requests']:.0f} requests"
        )
    if taken:
        print(f"all: {total:.1f} CPU-s, {total / (taken / B.GiB):.2f} CPU-s per GiB taken in")
    return 0


if __name__ == "__main__":
    sys.exit(main())
