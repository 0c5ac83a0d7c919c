"""What the end-to-end benchmarks on slurm-dev's networked cluster share (the startup
benchmark of issue 10, ``startup/bench.py``, and the real-size one of issue 19,
``realsize/bench.py``): logging, the per-node CPU cgroups, the sampler of link counters,
CPU and load, the site config writer, and the jobs' plumbing (submit as the job user,
wait, read ``bootseer report --json``, let the store link go quiet).

Import it after putting ``slurm-dev`` and ``lib`` on ``sys.path`` (each bench does)."""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.util
import json
import os
import pwd
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import devcluster

MiB = 1 << 20
GiB = 1 << 30
BENCH = Path(__file__).resolve().parent


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sh(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(cmd, text=True, capture_output=True, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-2000:]}")
    return r


def deps_bench() -> ModuleType:
    """The dependency benchmark's module (its PEP 503 index builder)."""
    spec = importlib.util.spec_from_file_location("deps_bench", BENCH / "deps" / "bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def user_exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
        return True
    except KeyError:
        return False


def default_user() -> str:
    return next((u for u in devcluster.USERS if user_exists(u)), "root")


def epoch(iso: str) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


# -- CPU: a cgroup per node ------------------------------------------------------------


class CpuGroups:
    """A cpuacct cgroup (v1) per node and one for the store host: every process a node's
    slurmd or agent starts inherits it, so its usage is the node's CPU time."""

    ROOT = Path("/sys/fs/cgroup/cpuacct")

    def __init__(self, cluster: devcluster.Cluster, name: str = "startup") -> None:
        self.c = cluster
        self.base = self.ROOT / f"bootseer-{name}-bench-{cluster.s.port_base}"
        self.ok = (self.ROOT / "cgroup.procs").exists()

    def group(self, name: str) -> Path:
        return self.base / name

    def adopt(self, name: str, pid: int | None) -> None:
        if not self.ok or pid is None:
            return
        g = self.group(name)
        g.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            (g / "cgroup.procs").write_text(f"{pid}\n")

    def adopt_cluster(self) -> None:
        for node in self.c.s.node_names:
            self.adopt(node, self.c.alive(f"slurmd-{node}"))
            self.adopt(node, self.c.alive(f"bootseer-agent-{node}"))
        self.adopt("store", self.c.alive("weed"))

    def usage(self, name: str) -> float | None:
        try:
            return int((self.group(name) / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            return None

    def pids(self, name: str) -> list[int]:
        try:
            return [int(p) for p in (self.group(name) / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def release(self) -> None:
        """Move every process back to the root group and remove ours."""
        if not self.ok or not self.base.exists():
            return
        for g in sorted(self.base.iterdir(), reverse=True):
            if not g.is_dir():
                continue
            for _ in range(3):
                pids = (g / "cgroup.procs").read_text().split()
                for pid in pids:
                    with contextlib.suppress(OSError):
                        (self.ROOT / "cgroup.procs").write_text(f"{pid}\n")
                if not pids:
                    break
            with contextlib.suppress(OSError):
                g.rmdir()
        with contextlib.suppress(OSError):
            self.base.rmdir()


# Processes in a node's cgroup that are not bootseer's own: Slurm's, and the job's (which
# run as the job user; bootseer's agent, hooks and checkpoint daemon run as root).
NOT_BOOTSEER = {"slurmd", "slurmstepd", "sleep", "sh", "bash", "srun"}
TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Proc:
    """One process of a node's cgroup, as ``/proc/PID/stat`` and its owner tell."""

    pid: int
    ppid: int
    uid: int
    comm: str
    started: int  # clock ticks after boot: with the pid, the process's identity
    cpu_s: float  # user and system time, its own (not its children's)


def read_proc(pid: int) -> Proc | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    f = stat[stat.rindex(")") + 2 :].split()
    return Proc(pid, int(f[1]), uid, comm, int(f[19]), (int(f[11]) + int(f[12])) / TICK)


def bootseer_procs(procs: list[Proc], known: set[tuple[int, int]]) -> list[Proc]:
    """Which of a node's processes are bootseer's: its root processes but Slurm's (agent,
    hooks, checkpoint daemon), and every descendant of one of those whatever its owner
    (a restore's child runs as the job's user, and its ``tar`` under it). ``known``
    holds the (pid, start) of processes found so in earlier samples (a child's parent
    may have exited since) and is updated."""
    by_pid = {p.pid: p for p in procs}
    mine: dict[int, Proc] = {}

    def is_mine(p: Proc, depth: int = 0) -> bool:
        if p.pid in mine or (p.pid, p.started) in known:
            return True
        if p.comm in NOT_BOOTSEER:
            return False
        if p.uid == 0:
            return True
        parent = by_pid.get(p.ppid)
        return parent is not None and depth < 64 and is_mine(parent, depth + 1)

    for p in procs:
        if is_mine(p):
            mine[p.pid] = p
            known.add((p.pid, p.started))
    return list(mine.values())


# What each of bootseer's processes is, by its own command line or its nearest
# ancestor's: the node agent, a checkpoint mount's daemon, or the prolog and epilog
# (with what they start: a restore's child and its ``tar``, run as the job's user).
ROLES = ("agent", "ckptd", "hooks")


def role_of(cmdline: list[str]) -> str | None:
    """``agent``, ``ckptd`` or ``hooks`` for one of bootseer's own command lines."""
    if "bootseer.ckptd" in cmdline:
        return "ckptd"
    if "bootseer.hooks" in cmdline:
        return "hooks"
    for i, arg in enumerate(cmdline[:2]):  # bootseer's entry point, or Python running it
        if os.path.basename(arg) == "bootseer":
            return "agent" if cmdline[i + 1 : i + 2] == ["agent"] else None
    return None


def read_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def role_in_tree(p: Proc, by_pid: dict[int, Proc], known: dict[tuple[int, int], str]) -> str:
    """``p``'s role: its command line's (:func:`role_of`), else its nearest ancestor's
    among ``by_pid`` (or in ``known``, by pid and start time); ``other`` if none has one."""
    q: Proc | None = p
    for _ in range(64):  # a parent chain this long is no process tree of ours
        if q is None:
            break
        role = role_of(read_cmdline(q.pid))
        if role is not None:
            return role
        parent = by_pid.get(q.ppid)
        if parent is not None and (parent.pid, parent.started) in known:
            return known[parent.pid, parent.started]
        q = parent
    return "other"


class OwnCpu:
    """Bootseer's own CPU seconds on the nodes (``bootseer_procs``: agent, hooks,
    checkpoint daemon, and what they start, a restore's ``tar`` run as the user too),
    summed from ``/proc/PID/stat`` at every sample, in all and by :data:`ROLES`. Each
    process counts with the most CPU it was seen with, so the total only grows; a process
    that lives less than a sampling period is missed, one that exits loses at most the
    CPU of its last period."""

    def __init__(self, cpu: CpuGroups, nodes: list[str]) -> None:
        self.cpu = cpu
        self.nodes = nodes
        self.seen: dict[tuple[int, int], float] = {}  # (pid, start time) -> CPU seconds
        self.roles: dict[tuple[int, int], str] = {}  # (pid, start time) -> its role
        self.known: set[tuple[int, int]] = set()

    def sample(self) -> dict[str, float]:
        """CPU seconds so far by role (``other``: a process no role's line names)."""
        for node in self.nodes:
            procs = [p for p in map(read_proc, self.cpu.pids(node)) if p is not None]
            by_pid = {p.pid: p for p in procs}
            for p in bootseer_procs(procs, self.known):
                key = (p.pid, p.started)
                self.seen[key] = max(self.seen.get(key, 0.0), p.cpu_s)
                if key not in self.roles:
                    self.roles[key] = role_in_tree(p, by_pid, self.roles)
        out = dict.fromkeys((*ROLES, "other"), 0.0)
        for key, cpu in self.seen.items():
            out[self.roles.get(key, "other")] += cpu
        return out


# -- sampling: link counters, CPU per node, load ------------------------------------------


@dataclass
class Sample:
    t: float
    egress: int
    rx: dict[str, int]
    cpu: dict[str, float | None]
    load1: float
    own_cpu: float = 0.0
    # each node's agent metrics (``metrics``' names and labels -> value), read once a second
    agent: dict[str, dict[str, float]] = field(default_factory=dict)
    own_roles: dict[str, float] = field(default_factory=dict)  # own_cpu by OwnCpu's role


def agent_metrics(path: Path) -> dict[str, float]:
    """An agent's textfile (Prometheus text format) as ``name{labels}`` -> value; {} if
    it is not there yet. The agent rewrites it every ``[metrics] interval`` seconds."""
    out: dict[str, float] = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[key] = float(value)
    return out


class Sampler:
    def __init__(
        self,
        cluster: devcluster.Cluster,
        cpu: CpuGroups,
        nodes: list[str],
        own: bool = False,
        agents: bool = False,
    ) -> None:
        self.net = cluster.s.network
        self.cpu = cpu
        self.nodes = nodes
        self.own = OwnCpu(cpu, nodes) if own else None
        # the agents' metric files, when asked (a read a second: they change every 2 s)
        self.agent_files = (
            {n: cluster.dir / "nodes" / n / "metrics" / "bootseer_agent.prom" for n in nodes}
            if agents
            else {}
        )
        self._agent: dict[str, dict[str, float]] = {}
        self._agent_t = 0.0
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> Sample:
        now = time.time()
        if self.agent_files and now - self._agent_t >= 1.0:
            self._agent = {n: agent_metrics(f) for n, f in self.agent_files.items()}
            self._agent_t = now
        roles = self.own.sample() if self.own else {}
        return Sample(
            now,
            self.net.store_egress_bytes(),
            {n: self.net.node_rx_bytes(n) for n in self.nodes},
            {n: self.cpu.usage(n) for n in [*self.nodes, "store"]},
            load1(),
            sum(roles.values()),
            self._agent,
            roles,
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.sample())
            self._stop.wait(0.2)

    def __enter__(self) -> Sampler:
        self.samples.append(self.sample())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self.sample())

    def at(self, t: float) -> Sample:
        """The counters at wall time ``t`` (the first sample at or after it)."""
        for s in self.samples:
            if s.t >= t:
                return s
        return self.samples[-1]

    def since(self, t0: float) -> Sample:
        """The last sample at or before wall time ``t0`` (the first if none is)."""
        before = [s for s in self.samples if s.t <= t0]
        return before[-1] if before else self.samples[0]

    def own_cpu(self, t0: float, t1: float) -> float:
        """Bootseer's own CPU seconds between wall times ``t0`` and ``t1``."""
        return max(0.0, self.at(t1).own_cpu - self.since(t0).own_cpu)

    def own_roles(self, t0: float, t1: float) -> dict[str, float]:
        """:meth:`own_cpu` by role (:data:`ROLES`, and ``other``)."""
        a, z = self.since(t0), self.at(t1)
        return {r: round(max(0.0, v - a.own_roles.get(r, 0.0)), 2) for r, v in z.own_roles.items()}


# -- the site config ---------------------------------------------------------------------


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(v)


def dump_toml(data: dict[str, Any], who: str = "the startup benchmark") -> str:
    out = [f"# slurm-dev site config, changed for {who} (restored after)."]
    for section, table in data.items():
        out.append(f"\n[{section}]")
        out += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(out) + "\n"


@contextlib.contextmanager
def config_setting(cluster: devcluster.Cluster, setting: str, who: str) -> Iterator[None]:
    """The site config with ``setting`` (``section.key=value``, the value in TOML) for the
    block, put back after: a variant that differs from another by one setting, in the same
    run (``bootseer@ckpt.warm_mib=0``). Nothing changes for ``""``."""
    if not setting:
        yield
        return
    name, _, value = setting.partition("=")
    path = name.strip().split(".")
    if len(path) < 2 or not all(path) or not value:
        raise ValueError(f"{setting!r}: not section.key=value")
    saved = cluster.site_config.read_text()
    data = tomllib.loads(saved)
    table = data
    for part in path[:-1]:
        table = table.setdefault(part, {})
    table[path[-1]] = tomllib.loads(f"v = {value}")["v"]
    cluster.site_config.write_text(dump_toml(data, who))
    try:
        yield
    finally:
        cluster.site_config.write_text(saved)


def bench_site_config(cluster: devcluster.Cluster, py: str, ckpt_deadline: int, who: str) -> str:
    """Write slurm-dev's site config as a benchmark's jobs need it (long hook and step
    deadlines, three S3 checkpoint targets beside the store, the bare interpreter's tree
    as a link root); returns the text before, for the benchmark to put back."""
    saved = cluster.site_config.read_text()
    data = tomllib.loads(saved)
    base, _, query = cluster.store_uri().partition("?")
    data.setdefault("hooks", {}).update(
        prolog_deadline=170,
        epilog_deadline=170,
        step_deadlines={"image": 170, "deps": 170, "ckpt": ckpt_deadline},
    )
    data.setdefault("image", {})["hot_deadline"] = 160.0
    data.setdefault("ckpt", {})["targets"] = [f"{base}-ckpt/t{i}?{query}" for i in (1, 2, 3)]
    data["ckpt"]["unit_size"] = 4 << 20
    data.setdefault("deps", {})["link_roots"] = ["/usr", "/opt", str(Path(py).parents[1])]
    cluster.site_config.write_text(dump_toml(data, who))
    return saved


# -- jobs ----------------------------------------------------------------------------------


def wait_bundles(
    cluster: devcluster.Cluster, env: dict[str, str], image: str, user: str, timeout: float = 300
) -> None:
    """Wait until ``user``'s trace of ``image`` names its bundles: a recording run's first
    node writes them after its epilog (bootseer.image.bundles), and a cold start before
    then, or a cold() that stops the agent meanwhile, reads the hot set block by block."""
    from bootseer.config import load_config

    icfg = load_config(cluster.site_config).image
    if not icfg.bundle_kib:
        return
    cap = icfg.bundle_max_gib * GiB - (icfg.bundle_kib << 10)  # whole bundles within it
    t0 = time.monotonic()
    while True:
        show = json.loads(sh(["bootseer", "image", "show", image], env=env).stdout)
        trace = show["traces"].get(user, {})
        done, hot = trace.get("bundled_bytes", 0), trace.get("hot_bytes", 0)
        if (done and done >= min(hot, cap)) or time.monotonic() - t0 > timeout:
            break
        time.sleep(1.0)
    waited = time.monotonic() - t0
    log(f"bundles: {done / MiB:.0f} of {hot / MiB:.0f} MiB of the trace after {waited:.0f}s")


class ClusterJobs:
    """Jobs on the cluster as ``user``: their environment, waiting, output, report."""

    def __init__(self, cluster: devcluster.Cluster, user: str, out: Path) -> None:
        self.c = cluster
        self.user = user
        self.out = out
        self.env = {**os.environ, **cluster.env()}
        self.user_env = self.env if user == "root" else {**self.env, **devcluster.user_env(user)}
        self.as_user = [] if user == "root" else devcluster.as_user(user)

    def submit(
        self,
        name: str,
        nodes: list[str],
        exports: dict[str, str],
        opts: list[str],
        script: Path,
        cwd: Path,
        wait: bool = True,
    ) -> int:
        """``sbatch`` ``script`` on exactly ``nodes`` as the user, with ``exports`` added to
        the environment and ``opts`` (the job's ``--bootseer*``); waits for it to end
        unless ``wait`` is false."""
        r = sh(
            [
                *self.as_user,
                "sbatch",
                "--parsable",
                "-N",
                str(len(nodes)),
                "-w",
                ",".join(nodes),
                "-J",
                name,
                f"--output={self.out}/%j.out",
                "--export=ALL," + ",".join(f"{k}={v}" for k, v in exports.items()),
                *opts,
                str(script),
            ],
            env=self.user_env,
            cwd=cwd,
        )
        job = int(r.stdout.strip().split(";")[0])
        if wait:
            self.wait(job)
        return job

    def wait(self, job: int, timeout: float = 3600) -> None:
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end:
            r = subprocess.run(
                ["squeue", "-h", "-j", str(job), "-t", "all", "-o", "%T"],
                env=self.env,
                text=True,
                capture_output=True,
            )
            state = r.stdout.strip()
            if state and state not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING"):
                if state != "COMPLETED":
                    raise RuntimeError(f"job {job} ended {state}:\n{self.output(job)[-3000:]}")
                return
            time.sleep(0.5)
        raise RuntimeError(f"job {job} still running after {timeout:.0f}s")

    def output(self, job: int) -> str:
        try:
            return (self.out / f"{job}.out").read_text()
        except FileNotFoundError:
            return "(no output)"

    def report(self, job: int, nodes: int, timeout: float = 60) -> dict[str, Any]:
        """``bootseer report JOB --json`` once every node's first_step is in it."""
        t_end = time.monotonic() + timeout
        got: dict[str, Any] = {}
        while time.monotonic() < t_end:
            r = subprocess.run(
                ["bootseer", "report", str(job), "--json"],
                env=self.env,
                text=True,
                capture_output=True,
            )
            if r.returncode == 0:
                got = json.loads(r.stdout)
                runs = got.get("runs") or []
                if (
                    runs
                    and sum(
                        any(p["phase"] == "first_step" for p in n["phases"])
                        for n in runs[-1]["nodes"]
                    )
                    >= nodes
                ):
                    return dict(runs[-1])
            time.sleep(1)
        raise RuntimeError(f"job {job}: no complete report after {timeout:.0f}s: {got}")

    def quiet(self, secs: float = 1.5, timeout: float = 120) -> None:
        """Wait until the store link has carried (almost) nothing for ``secs``."""
        net = self.c.s.network
        t_end = time.monotonic() + timeout
        last, since = net.store_egress_bytes(), time.monotonic()
        while time.monotonic() < t_end:
            time.sleep(0.25)
            now = net.store_egress_bytes()
            if now - last > 64 * 1024:
                since = time.monotonic()
            last = now
            if time.monotonic() - since >= secs:
                return
