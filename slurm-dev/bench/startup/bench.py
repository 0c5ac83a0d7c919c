"""Startup against job size: the end-to-end benchmark (issue 10).

A training job's start, on N nodes of slurm-dev's networked cluster (each node a host
behind its own capped link, the S3 store host behind a slower one)::

    slurm-dev/up --s3 --store-mbit 100 --node-mbit 1000 --nodes 16
    slurm-dev/bench/startup/bench.py --nodes 1,2,4,8,16 --json startup.json
    slurm-dev/bench/startup/bench.py --smoke --json smoke.json      # N = 1, 4; small sizes

The workload, on every node (``node.sh``): the container from a squashfs image of
several hundred MiB (random filler; the start script reads ~15% of it, ``app/lib``),
a real install of several tens of MiB (a venv of wheels from a PEP 503 index served
from the store host, by ``uv``), a checkpoint of >= 128 MiB read whole, then a first
step that imports the installed packages. Two variants, alternating for each N:

- ``baseline``: every node copies the image from the store (one object), mounts it,
  installs, and reads the checkpoint as one object from the store. The job runs with a
  bare ``--bootseer`` (no technique: only the phase records, so both variants are
  timed by the same instrument).
- ``bootseer``: ``--bootseer-image`` (a name registered with ``bootseer image add``),
  ``--bootseer-deps`` with the install run by ``bootseer deps run``, ``--bootseer-ckpt``
  (the checkpoint a first, recording run saved through the mount). One recording run
  (N = 1, ``--bootseer=refresh``) comes first; every measured point starts on cold
  nodes.

Before every point, on each of its nodes: the agent is stopped, the node's caches (image
blocks, snapshot stamps) and local directory are wiped, the agent is started again,
and the store link is let go quiet. Measured per point, from ``bootseer report --json``
and the links' counters (sampled every 0.2 s):

- ``startup_s``: allocation to the end of the last node's ``first_step``;
- ``spread``: (max - min) / median of the nodes' ready times (``first_step`` starts);
- ``holds_s``: allocation until every node holds what its start needs (the last end of
  a node's image, deps and checkpoint phases: prefetch/pull, container start, restore or
  install, checkpoint load);
- ``store_egress_bytes``: what the store sent on its link from submit until the last
  first step; ``store_egress_job_bytes`` until the job's end (epilogs done);
- ``peer_bytes``: the job nodes' received bytes minus the store's egress in the same
  window (what nodes got from each other), and ``peer_bytes_job``; what the phase
  records say (``bootseer report``'s ``peer_bytes`` and ``store_egress_bytes`` of the
  run, every phase of every node) is ``peer_bytes_recorded`` and ``store_egress_recorded``;
- ``cpu_s_per_node`` (mean over the job's nodes) and ``cpu_s_max``: CPU seconds of
  everything on the node (slurmd and what it starts, the agent), from a cpuacct cgroup
  per node over the job; ``store_cpu_s`` the store host's; ``load1`` the 1-minute load
  average at the last first step, ``load1_max`` the highest sampled.

With ``--train-s S`` every node "trains" (sleeps) S seconds after its first step, so
that the image's background fill, which starts there, runs in the job: the ``(job)``
egress is then the whole job's with the fill (``fill_bytes``) included.

Runs as root; the jobs run as an ordinary user (``--user``, default slurm-dev's
``alice``). It changes the cluster's site config for its run (checkpoint targets on
the S3 store host, deadlines inside PrologEpilogTimeout) and puts it back at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TOP = HERE.parents[2]
sys.path.insert(0, str(TOP / "slurm-dev"))
sys.path.insert(0, str(TOP / "lib"))

import devcluster  # noqa: E402
from storehost import stop_http  # noqa: E402

sys.path.insert(0, str(HERE.parent))
from benchkit import (  # noqa: E402
    ClusterJobs,
    CpuGroups,
    Sample,
    Sampler,
    bench_site_config,
    config_setting,
    default_user,
    deps_bench,
    epoch,
    log,
    sh,
    wait_bundles,
)

MiB = 1 << 20
WORK = Path(os.environ.get("BOOTSEER_BENCH_DIR", "/var/tmp/bootseer-startup-bench"))
INDEX_PORT = 8766  # in the store host's network namespace (weed uses its own ports)
LOCAL = "startup-bench"  # under each node's local dir (/var/tmp/slurm-dev-local)
CKPT_NS = "startup-bench"
STORE_PREFIX = "bench/startup"  # plain objects the baseline reads, under the store URI


@dataclass(frozen=True)
class Size:
    image_mib: int  # filler + hot, about
    hot_mib: int  # what the start script reads
    ckpt_mib: int
    packages: tuple[str, ...]
    imports: str  # what the first step imports


FULL = Size(408, 58, 128, ("numpy==2.2.6", "six", "idna", "packaging", "attrs"), "numpy, six")
SMOKE = Size(28, 4, 16, ("six", "idna", "packaging", "attrs"), "six, idna")

# Phases after which a node holds what its start needs (image, deps, checkpoint).
DATA_PHASES = {
    "image_prefetch",
    "image_pull",
    "container_start",
    "deps_restore",
    "deps_install",
    "ckpt_mount",
    "ckpt_load",
}


# -- the workload's artifacts ---------------------------------------------------------


def build_image(size: Size, out: Path) -> Path:
    """A squashfs of ``hot_mib`` 1 MiB libraries the start reads and 8 MiB filler shards
    it never reads, all random bytes, stored uncompressed (no CPU to unpack)."""
    if out.exists():
        return out
    root = out.with_suffix(".root")
    shutil.rmtree(root, ignore_errors=True)
    (root / "app" / "lib").mkdir(parents=True)
    (root / "data").mkdir()
    shutil.copy(HERE / "start.py", root / "app" / "start.py")
    for i in range(size.hot_mib):
        (root / "app" / "lib" / f"mod{i:03d}.so").write_bytes(os.urandom(MiB))
    for i in range(max(1, (size.image_mib - size.hot_mib) // 8)):
        (root / "data" / f"shard{i:03d}.bin").write_bytes(os.urandom(8 * MiB))
    tmp = out.with_suffix(".tmp")
    quiet = ["-noappend", "-quiet", "-no-progress"]
    sh(["mksquashfs", str(root), str(tmp), *quiet, "-noI", "-noD", "-noF", "-noX"])
    tmp.chmod(0o644)
    os.replace(tmp, out)
    shutil.rmtree(root)
    return out


def build_ckpt(size: Size, out: Path) -> Path:
    if not out.exists() or out.stat().st_size != size.ckpt_mib * MiB:
        with open(out.with_suffix(".tmp"), "wb") as f:
            for _ in range(size.ckpt_mib):
                f.write(os.urandom(MiB))
        os.replace(out.with_suffix(".tmp"), out)
        out.chmod(0o644)
    return out


# -- sampling: link counters, CPU per node, load --------------------------------------


# -- the cluster -------------------------------------------------------------------------


class Bench(ClusterJobs):
    def __init__(
        self, cluster: devcluster.Cluster, size: Size, mode: str, user: str, train_s: float = 0
    ) -> None:
        super().__init__(cluster, user, WORK / mode / "out")
        self.train_s = train_s
        self.size = size
        self.cpu = CpuGroups(cluster)
        # The interpreter the jobs build their own environments on (`venv`/`uv venv --python`),
        # as a site's would be: the bare binary on purpose, so no job env is layered on
        # bootseer's venv, and its prefix is a deps link root. Nothing of bootseer runs on it
        # (the bench's own helpers run on sys.executable, the venv's).
        self.py = os.path.realpath(sys.executable)
        self.uv = shutil.which("uv", path=self.env["PATH"]) or "uv"
        store_ip = cluster.s.store_ips[1]
        self.index_url = f"http://{store_ip}:{INDEX_PORT}/simple"
        self.store_url = f"http://{store_ip}:{cluster.s.s3_port}/bootseer/store"
        self.index_proc: subprocess.Popen[bytes] | None = None
        self.work = WORK / mode
        self.req = self.work / "requirements.txt"
        self.image_name = f"startup-bench:{mode}"
        self.saved_config: str | None = None

    # -- setup ---------------------------------------------------------------------------

    def site_config(self) -> None:
        self.saved_config = bench_site_config(self.c, self.py, 60, "the startup benchmark")

    def restore_config(self) -> None:
        if self.saved_config is not None:
            self.c.site_config.write_text(self.saved_config)

    def prepare(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        for d in (WORK, self.work):
            d.chmod(0o755)  # the job's user reads the requirements and the checkpoint here
        self.out.mkdir(exist_ok=True)
        self.out.chmod(0o1777)  # and writes its output here
        self.req.write_text("\n".join(self.size.packages) + "\n")
        index = deps_bench().build_index(list(self.size.packages), self.work / "index")
        self.start_index(index)
        self.image = build_image(self.size, self.work / "image.sqsh")
        self.ckpt = build_ckpt(self.size, self.work / "ckpt.bin")
        log(
            f"image {self.image.stat().st_size / MiB:.0f} MiB (start reads {self.size.hot_mib} "
            f"MiB), checkpoint {self.size.ckpt_mib} MiB, packages {' '.join(self.size.packages)}"
        )

        store = self.c.open_store()
        t0 = time.monotonic()
        for key, path in (("image.sqsh", self.image), ("ckpt.bin", self.ckpt)):
            if store.exists(f"{STORE_PREFIX}/{key}") and (
                store.info(f"{STORE_PREFIX}/{key}").size == path.stat().st_size  # type: ignore[union-attr]
            ):
                continue
            with open(path, "rb") as f, store.writer(f"{STORE_PREFIX}/{key}") as w:
                shutil.copyfileobj(f, w, 8 * MiB)
        sh(["bootseer", "image", "add", str(self.image), "--name", self.image_name], env=self.env)
        # The recording run saves the checkpoint anew and captures a new snapshot.
        subprocess.run(
            ["bootseer", "ckpt", "rm", "--user", self.user, f"{CKPT_NS}:model.bin"],
            env=self.env,
            capture_output=True,
        )
        log(
            f"stored the image (plain and registered) and the checkpoint in "
            f"{time.monotonic() - t0:.0f}s"
        )

    def start_index(self, root: Path) -> None:
        self.index_proc = self.c.serve_http(root, INDEX_PORT)

    def stop_index(self) -> None:
        stop_http(self.index_proc)
        self.index_proc = None

    def cold(self, nodes: list[str]) -> None:
        """Agents stopped, caches and local directories wiped, agents started again."""
        for node in nodes:
            pid = self.c.alive(f"bootseer-agent-{node}")
            if pid:
                devcluster.stop_pid(pid, f"bootseer-agent-{node}")
        for node in nodes:
            d = self.c.dir / "nodes" / node
            for sub in (d / "cache", d / "local" / LOCAL):
                shutil.rmtree(sub, ignore_errors=True)
            (d / "cache").mkdir(parents=True, exist_ok=True)
        for node in nodes:
            self.c.start_agent(node)
            self.cpu.adopt(node, self.c.alive(f"bootseer-agent-{node}"))
        self.quiet()

    # -- one job -----------------------------------------------------------------------

    def job(self, variant: str, nodes: list[str], mode: str = "on", save: bool = False) -> int:
        opts = (
            ["--bootseer"]
            if variant == "baseline"
            else [
                f"--bootseer={mode}",
                f"--bootseer-image={self.image_name}",
                f"--bootseer-deps=/var/tmp/slurm-dev-local/{LOCAL}/env,key={self.req}",
                f"--bootseer-ckpt={CKPT_NS}",
            ]
        )
        exports = {
            "BENCH_VARIANT": variant,
            "BENCH_HERE": str(HERE),
            "BENCH_DIR": str(self.work),
            "BENCH_STORE_URL": self.store_url,
            "BENCH_IMAGE_KEY": f"{STORE_PREFIX}/image.sqsh",
            "BENCH_CKPT_KEY": f"{STORE_PREFIX}/ckpt.bin",
            "BENCH_INDEX": self.index_url,
            "BENCH_REQ": str(self.req),
            "BENCH_PY": self.py,
            "BENCH_UV": self.uv,
            "BENCH_IMPORTS": self.size.imports.replace(" ", ""),
            "BENCH_SAVE": "1" if save else "0",
            "BENCH_TRAIN_S": "0" if save else f"{self.train_s:g}",
            "PIP_CONFIG_FILE": "/dev/null",
        }
        return self.submit(f"startup-{variant}", nodes, exports, opts, HERE / "job.sh", self.work)

    # -- one point ---------------------------------------------------------------------

    def point(self, variant: str, n: int) -> dict[str, Any]:
        """One start on N cold nodes. ``variant``: ``baseline``, ``bootseer``, or either
        with one site setting changed for this point (``bootseer@ckpt.warm_mib=0``)."""
        nodes = self.c.s.node_names[:n]
        kind, _, setting = variant.partition("@")
        with config_setting(self.c, setting, "the startup benchmark"):
            self.cold(nodes)  # the agents read the setting too
            with Sampler(self.c, self.cpu, nodes) as sampler:
                t0 = time.time()
                job = self.job(kind, nodes)
        run = self.report(job, n)
        row = summarize(variant, nodes, job, run, sampler, t0, self.output(job))
        return {**row, "train_s": self.train_s} if self.train_s else row


def summarize(
    variant: str,
    nodes: list[str],
    job: int,
    run: dict[str, Any],
    sampler: Sampler,
    t0: float,
    output: str,
) -> dict[str, Any]:
    allocated = epoch(run["allocated"])
    ready = {n["node"]: float(n["ready_seconds"]) for n in run["nodes"]}
    med = statistics.median(ready.values())
    holds = {
        n["node"]: max(
            (
                p["start_offset_seconds"] + p["seconds"]
                for p in n["phases"]
                if p["phase"] in DATA_PHASES
            ),
            default=0.0,
        )
        for n in run["nodes"]
    }
    phases = {p["phase"]: p for p in run["phases"]}
    startup = float(run["startup_seconds"])
    first, at_ready, last = sampler.samples[0], sampler.at(allocated + startup), sampler.samples[-1]

    def rx(s: Sample) -> int:
        return sum(s.rx[n] - first.rx[n] for n in nodes)

    def cpu(s: Sample, name: str) -> float | None:
        a, b = first.cpu.get(name), s.cpu.get(name)
        return None if a is None or b is None else b - a

    egress = at_ready.egress - first.egress
    egress_job = last.egress - first.egress
    cpus = [c for n in nodes if (c := cpu(last, n)) is not None]
    fill = phases.get("image_background_fill")
    return {
        "variant": variant,
        "nodes": len(nodes),
        "job_id": job,
        "startup_s": round(startup, 2),
        "spread": round((max(ready.values()) - min(ready.values())) / med, 4) if med else 0.0,
        "ready_s": {k: round(v, 2) for k, v in sorted(ready.items())},
        "holds_s": round(max(holds.values()), 2),
        "store_egress_bytes": egress,
        "store_egress_job_bytes": egress_job,
        "node_rx_bytes": rx(at_ready),
        "peer_bytes": max(0, rx(at_ready) - egress),
        "peer_bytes_job": max(0, rx(last) - egress_job),
        "peer_bytes_recorded": run.get("peer_bytes"),
        "store_egress_recorded": run.get("store_egress_bytes"),
        "fill_bytes": int(fill["bytes"]) if fill else 0,
        "cpu_s_per_node": round(statistics.mean(cpus), 2) if cpus else None,
        "cpu_s_max": round(max(cpus), 2) if cpus else None,
        "store_cpu_s": None if (c := cpu(last, "store")) is None else round(c, 2),
        "load1": at_ready.load1,
        "load1_max": max(s.load1 for s in sampler.samples),
        "queue_s": round(allocated - t0, 2),
        "job_s": round(last.t - t0, 2),
        "phases_max_s": {k: p["max_seconds"] for k, p in phases.items()},
        "phases_median_s": {k: p["median_seconds"] for k, p in phases.items()},
        "deps": "restored" if "deps_restore" in phases and "skipping" in output else "installed",
    }


# -- output ------------------------------------------------------------------------------


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'variant':<9}{'N':>3}{'startup s':>10}{'gain':>8}{'spread':>8}{'holds s':>9}"
        f"{'egress MiB':>11}{'(job)':>7}{'peer MiB':>9}{'(job)':>7}{'cpu s/node':>11}"
        f"{'load':>6}"
    )
    base = {r["nodes"]: r["startup_s"] for r in rows if r["variant"] == "baseline"}
    lines = [head]
    for r in rows:
        gain = (
            f"{base[r['nodes']] / r['startup_s']:.2f}x"
            if r["variant"] != "baseline" and r["nodes"] in base and r["startup_s"]
            else ""
        )
        cpu = "" if r["cpu_s_per_node"] is None else f"{r['cpu_s_per_node']:.1f}"
        lines.append(
            f"{r['variant']:<9}{r['nodes']:>3}{r['startup_s']:>10.1f}{gain:>8}"
            f"{r['spread'] * 100:>7.0f}%{r['holds_s']:>9.1f}"
            f"{r['store_egress_bytes'] / MiB:>11.0f}{r['store_egress_job_bytes'] / MiB:>7.0f}"
            f"{r['peer_bytes'] / MiB:>9.0f}{r['peer_bytes_job'] / MiB:>7.0f}{cpu:>11}"
            f"{r['load1']:>6.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="N = 1 and 4, small sizes (CI)")
    p.add_argument("--nodes", default=None, help="comma-separated N (default 1,2,4,8,16)")
    p.add_argument(
        "--variants",
        default="baseline,bootseer",
        help="which, in this order; VARIANT@section.key=value: with that site setting",
    )
    p.add_argument(
        "--state-dir", default=os.environ.get("BOOTSEER_DEV_STATE", "/var/tmp/bootseer-dev")
    )
    p.add_argument("--json", help="write one record per point here (a JSON list)")
    p.add_argument(
        "--train-s",
        type=float,
        default=0,
        help="seconds each node trains after its first step (the background fill runs then; "
        "the points' '(job)' egress is the whole job's, fill included)",
    )
    p.add_argument(
        "--user",
        default=default_user(),
        help="submit the jobs as this user (default: slurm-dev's alice)",
    )
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench: run as root (it restarts agents and reads link counters)")
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    counts = [int(x) for x in (args.nodes or ("1,4" if args.smoke else "1,2,4,8,16")).split(",")]
    variants = args.variants.split(",")
    cluster = devcluster.Cluster.load(Path(args.state_dir))
    if not cluster.s.s3:
        raise SystemExit("bench: the cluster needs the S3 store host: slurm-dev/up --s3")
    if max(counts) > cluster.s.nodes:
        raise SystemExit(f"bench: N up to {max(counts)} needs as many nodes: slurm-dev/up --nodes")
    size = SMOKE if args.smoke else FULL
    b = Bench(cluster, size, "smoke" if args.smoke else "full", args.user, args.train_s)
    net = cluster.s.network
    log(
        f"cluster {cluster.dir}: {cluster.s.nodes} nodes, store link {net.store_mbit} Mbit/s, "
        f"node links {net.node_mbit} Mbit/s; N = {counts}; {os.cpu_count()} CPUs; "
        f"jobs as {args.user}"
    )
    rows: list[dict[str, Any]] = []
    try:
        b.cpu.adopt_cluster()
        b.site_config()
        b.prepare()
        if any(v.partition("@")[0] == "bootseer" for v in variants):
            b.cold(cluster.s.node_names[:1])
            job = b.job("bootseer", cluster.s.node_names[:1], mode="refresh", save=True)
            out = b.output(job)
            if "BENCH saved" not in out:
                raise RuntimeError(f"the recording run {job} saved no checkpoint:\n{out[-3000:]}")
            log(f"recording run: job {job} (trace, snapshot, checkpoint)")
            wait_bundles(cluster, b.env, b.image_name, b.user)
        for n in counts:
            for v in variants:
                r = b.point(v, n)
                rows.append(r)
                log(
                    f"{v} N={n}: startup {r['startup_s']:.1f}s, spread {r['spread']:.0%}, "
                    f"egress {r['store_egress_bytes'] / MiB:.0f} MiB "
                    f"({r['store_egress_job_bytes'] / MiB:.0f}), peer {r['peer_bytes'] / MiB:.0f} "
                    f"MiB, cpu/node {r['cpu_s_per_node']}s, load {r['load1']}"
                )
                if args.json:
                    Path(args.json).write_text(json.dumps(rows, indent=1))
    finally:
        b.stop_index()
        b.restore_config()
        b.cpu.release()
    print(
        f"startup against job size: image {b.image.stat().st_size / MiB:.0f} MiB "
        f"(start reads {size.hot_mib} MiB), checkpoint {size.ckpt_mib} MiB, "
        f"{len(size.packages)} packages; store link {net.store_mbit} Mbit/s, "
        f"node links {net.node_mbit} Mbit/s"
    )
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
