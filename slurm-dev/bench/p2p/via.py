#!/usr/bin/env python3
"""The agent's piece path for root's parts: what a checkpoint unit or a snapshot frame
costs once it is on the node (issue 19, "peer transfer", the per-piece part).

The checkpoint mount daemon and the prolog's restore ask the node's agent for each piece
(:func:`bootseer.p2p.via.agent_via`: a ``FetchPiece`` on its socket); the agent takes it
from its cache, the job's peers or the store, and the caller gets the verified bytes.
This bench runs a real agent (``tests.imagekit``: its own config, store and cache) and a
store object of ``--mib`` MiB in ``--piece-kib`` pieces. A first pass puts every piece in
the agent's cache (the store's read, not measured); each measured pass asks for every
piece again, as a daemon reading a checkpoint twice (``torch.load``, then its shards) or
a second job on the node does. Both sides' CPU per GiB: this process's
(``getrusage``, the caller's side) and the agent's (``/proc/<pid>/stat``, all threads),
and the threads the agent created over the measured passes (``perf stat -e
sched:sched_process_fork``: every clone, however short-lived; ``null`` without perf).

    python3 slurm-dev/bench/p2p/via.py --label before --json OUT.json [--mib 1024]

``--json`` appends this run's record to the file (a list), so one file holds before and
after. Run as root; the bench's directory is removed at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TOP = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(TOP))
sys.path.insert(0, str(TOP / "lib"))
sys.path.insert(0, str(TOP / "slurm-dev" / "bench"))

from measure import proc_cpu  # noqa: E402
from tests.imagekit import running_agent, site_config  # noqa: E402

from bootseer.config import SiteConfig  # noqa: E402
from bootseer.p2p.via import agent_via  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class ThreadsCreated:
    """Threads (and processes) ``pid`` creates while in the ``with``, counted by perf."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.count: int | None = None
        self._perf: subprocess.Popen[str] | None = None

    def __enter__(self) -> ThreadsCreated:
        try:
            self._perf = subprocess.Popen(
                ["perf", "stat", "-x,", "-e", "sched:sched_process_fork", "-p", str(self.pid)],
                stderr=subprocess.PIPE,
                text=True,
            )
        except FileNotFoundError:
            return self
        time.sleep(0.5)  # perf attaches to the process' threads (a bench, not a test)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._perf is None:
            return
        self._perf.send_signal(signal.SIGINT)
        _, err = self._perf.communicate(timeout=60)
        for line in err.splitlines():
            fields = line.split(",")
            if len(fields) > 2 and "sched_process_fork" in fields[2] and fields[0].isdigit():
                self.count = int(fields[0])


def run(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    piece = args.piece_kib * 1024
    count = args.mib * MIB // piece
    key = "deps/bench/via/data"
    (base / "store" / "deps/bench/via").mkdir(parents=True)
    shas = []
    with open(base / "store" / key, "wb") as f:
        for _ in range(count):
            data = os.urandom(piece)
            shas.append(hashlib.sha256(data).hexdigest())
            f.write(data)
    with running_agent(base) as agent:
        assert agent.proc is not None
        cfg = SiteConfig.from_mapping(site_config(base)).for_node("t1")
        # Two nodes, both this one's name: every piece is the agent's own, from its cache.
        via = agent_via(cfg, 4242, ("t1", "t1"), log=lambda _: None, owner=(0, ""))
        assert via is not None, "p2p is off in the bench's config"

        def one_pass() -> tuple[float, float, float]:
            t, mine, theirs = time.monotonic(), own_cpu(), proc_cpu(agent.proc.pid)
            for i, sha in enumerate(shas):
                got = via("", key, i * piece, piece, sha)
                assert got is not None, f"piece {i} did not come through the agent"
            return (
                time.monotonic() - t,
                own_cpu() - mine,
                proc_cpu(agent.proc.pid) - theirs,
            )

        one_pass()  # into the agent's cache
        with ThreadsCreated(agent.proc.pid) as threads:
            passes = [one_pass() for _ in range(args.passes)]
    gib = count * piece / GIB
    secs = statistics.median(p[0] for p in passes)
    return {
        "label": args.label,
        "bytes": count * piece,
        "piece_bytes": piece,
        "passes": args.passes,
        "seconds": round(secs, 3),
        "mb_s": round(count * piece / secs / 1e6, 1),
        "pieces_s": round(count / secs, 1),
        "caller_cpu_s_per_gib": round(statistics.median(p[1] for p in passes) / gib, 3),
        "agent_cpu_s_per_gib": round(statistics.median(p[2] for p in passes) / gib, 3),
        "agent_threads_created": threads.count,
        "load1": round(os.getloadavg()[0], 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", default="run")
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--piece-kib", type=int, default=4096, help="a checkpoint unit's size (4 MiB)")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bootseer-via-bench-", dir="/var/tmp"))
    try:
        rec = run(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(
        f"{rec['label']}: {rec['bytes'] // MIB} MiB in {rec['piece_bytes'] // 1024} KiB pieces: "
        f"{rec['seconds']} s, {rec['mb_s']} MB/s, {rec['pieces_s']} pieces/s, "
        f"caller {rec['caller_cpu_s_per_gib']} / "
        f"agent {rec['agent_cpu_s_per_gib']} CPU-s/GiB, "
        f"agent threads created {rec['agent_threads_created']}, load1 {rec['load1']}"
    )
    if args.json:
        old = json.loads(args.json.read_text()) if args.json.exists() else []
        args.json.write_text(json.dumps([*old, rec], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
