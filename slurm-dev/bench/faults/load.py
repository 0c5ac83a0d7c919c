"""Store egress under load: 52 four-node jobs submitted at once (issue 24).

The fault run of issue 24 loaded the store with 52 four-node jobs at once on one image,
one dependency snapshot and one checkpoint: the store sent 1.6x the piece bytes (every
prolog read the snapshot manifest again, and peers dropped under load sent their pieces
back to the store). This measures it again, on slurm-dev's networked S3 cluster::

    slurm-dev/up --s3 --nodes 4 --store-mbit 100 --node-mbit 1000
    slurm-dev/bench/faults/load.py --jobs 52 --json load.json

The workload is the startup benchmark's (``slurm-dev/bench/startup/node.sh``, its small
sizes unless ``--full``): each node of a job starts the container from the registered
image, restores the dependency snapshot, reads the whole checkpoint through its mount
and runs a first step. One recording run (one node) makes the trace, the snapshot and
the checkpoint. Then, on cold nodes (agents restarted, caches and local directories
wiped):

- ``alone``: one job, then a second one on the now warm nodes: the store's egress of
  each (``cold_bytes``, ``warm_bytes``) is what a job needs from outside its nodes when
  nothing else runs. The nodes keep image blocks, the restored snapshot and the
  records, not a checkpoint's units, so every job reads its checkpoint anew;
- ``load``: ``--jobs`` jobs submitted at once (as many run at once as the nodes' CPUs
  allow: slurm-dev gives each node 8), all on the same nodes, cold again first.

``piece_bytes`` is what the store must send for the load if each job's pieces came from
it once: ``cold_bytes + (jobs - 1) * warm_bytes``; ``egress_ratio`` the load's measured
egress (the store host's link counter, submit to the last job's end, epilogs included)
over it. ``drops`` counts the agents' "p2p: peer X dropped" lines in the window, and
``recorded_store_bytes`` sums what the jobs' phase records say they took from the store.
``load1`` is the 1-minute load average, its highest sample and at the end.

Runs as root; the jobs run as an ordinary user (``--user``, default slurm-dev's alice).
It changes the cluster's site config for its run and puts it back at the end.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TOP = HERE.parents[2]
sys.path.insert(0, str(TOP / "slurm-dev"))
sys.path.insert(0, str(TOP / "lib"))
sys.path.insert(0, str(HERE.parent))

import devcluster  # noqa: E402
from benchkit import Sampler, default_user, log  # noqa: E402

MiB = 1 << 20
DROP = "p2p: peer "


def _startup() -> Any:
    spec = importlib.util.spec_from_file_location(
        "startup_bench", HERE.parent / "startup" / "bench.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


startup = _startup()


class Load(startup.Bench):  # type: ignore[misc]
    wait_jobs = True

    def submit(self, *args: Any, **kw: Any) -> int:
        return int(super().submit(*args, **kw, wait=self.wait_jobs))

    def drops(self, nodes: list[str]) -> int:
        n = 0
        for node in nodes:
            log_file = self.c.dir / "nodes" / node / "log" / f"{node}-agent.log"
            try:
                text = log_file.read_text(errors="replace")
            except FileNotFoundError:
                continue
            n += sum(1 for line in text.splitlines() if DROP in line and " dropped " in line)
        return n

    def alone(self, nodes: list[str]) -> tuple[int, int]:
        """The store's egress of one job on cold nodes, then of one on warm ones."""
        self.cold(nodes)
        got = []
        for _ in range(2):
            with Sampler(self.c, self.cpu, nodes) as s:
                self.job("bootseer", nodes)
                self.quiet()
            got.append(s.samples[-1].egress - s.samples[0].egress)
        return got[0], got[1]

    def load(self, nodes: list[str], jobs: int) -> dict[str, Any]:
        self.cold(nodes)
        drops0 = self.drops(nodes)
        self.wait_jobs = False
        t0 = time.monotonic()
        try:
            with Sampler(self.c, self.cpu, nodes) as s:
                ids = [self.job("bootseer", nodes) for _ in range(jobs)]
                failed = []
                for j in ids:
                    try:
                        self.wait(j)
                    except RuntimeError as exc:
                        failed.append(f"{j}: {str(exc)[:300]}")
                self.quiet()
        finally:
            self.wait_jobs = True
        wall = time.monotonic() - t0
        recorded = 0
        ready = []
        for j in ids:
            try:
                run = self.report(j, len(nodes))
            except RuntimeError as exc:
                failed.append(f"{j}: {str(exc)[:300]}")
                continue
            recorded += int(run.get("store_egress_bytes") or 0)
            ready.append(float(run["startup_seconds"]))
        return {
            "jobs": jobs,
            "job_ids": ids,
            "failed": failed,
            "wall_s": round(wall, 1),
            "egress_bytes": s.samples[-1].egress - s.samples[0].egress,
            "recorded_store_bytes": recorded,
            "drops": self.drops(nodes) - drops0,
            "startup_s_max": max(ready, default=None),
            "startup_s_median": sorted(ready)[len(ready) // 2] if ready else None,
            "load1_max": max(x.load1 for x in s.samples),
            "load1_end": s.samples[-1].load1,
        }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--jobs", type=int, default=52, help="jobs submitted at once (default 52)")
    p.add_argument("--nodes", type=int, default=4, help="nodes per job (default 4)")
    p.add_argument("--full", action="store_true", help="the startup benchmark's full sizes")
    p.add_argument("--label", default="", help="a name for this run in the output")
    p.add_argument(
        "--state-dir", default=os.environ.get("BOOTSEER_DEV_STATE", "/var/tmp/bootseer-dev")
    )
    p.add_argument("--json", help="append this run's record here (a JSON list)")
    p.add_argument("--user", default=default_user(), help="submit the jobs as this user")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench: run as root (it restarts agents and reads link counters)")
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    cluster = devcluster.Cluster.load(Path(args.state_dir))
    if not cluster.s.s3:
        raise SystemExit("bench: the cluster needs the S3 store host: slurm-dev/up --s3")
    if args.nodes > cluster.s.nodes:
        raise SystemExit(f"bench: {args.nodes} nodes per job needs as many: slurm-dev/up --nodes")
    size = startup.FULL if args.full else startup.SMOKE
    b = Load(cluster, size, "full" if args.full else "smoke", args.user)
    nodes = cluster.s.node_names[: args.nodes]
    log(
        f"cluster {cluster.dir}: {cluster.s.nodes} nodes of {cluster.s.cpus_per_node} CPUs; "
        f"{args.jobs} jobs of {args.nodes} nodes; {os.cpu_count()} CPUs; jobs as {args.user}"
    )
    try:
        b.cpu.adopt_cluster()
        b.site_config()
        b.prepare()
        b.cold(nodes[:1])
        job = b.job("bootseer", nodes[:1], mode="refresh", save=True)
        if "BENCH saved" not in b.output(job):
            raise RuntimeError(f"the recording run {job} saved no checkpoint:\n{b.output(job)}")
        log(f"recording run: job {job}")
        cold, warm = b.alone(nodes)
        log(f"alone: cold {cold / MiB:.1f} MiB, warm {warm / MiB:.1f} MiB")
        row = b.load(nodes, args.jobs)
    finally:
        b.stop_index()
        b.restore_config()
        b.cpu.release()
    piece = cold + (args.jobs - 1) * warm
    row = {
        "label": args.label,
        "nodes": args.nodes,
        "cpus_per_node": cluster.s.cpus_per_node,
        "cold_bytes": cold,
        "warm_bytes": warm,
        "piece_bytes": piece,
        "egress_ratio": round(row["egress_bytes"] / piece, 3),
        **row,
    }
    log(
        f"load: {args.jobs} jobs in {row['wall_s']}s, egress {row['egress_bytes'] / MiB:.1f} MiB "
        f"of {piece / MiB:.1f} MiB pieces ({row['egress_ratio']}x), drops {row['drops']}, "
        f"failed {len(row['failed'])}, load1 max {row['load1_max']}"
    )
    if args.json:
        out = Path(args.json)
        rows = json.loads(out.read_text()) if out.exists() else []
        out.write_text(json.dumps([*rows, row], indent=1))
    return 0 if not row["failed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
