"""slurm-dev's daemons: starting, watching and stopping the processes of one cluster.

munged, slurmctld, one slurmd per node (each in namespaces of its own) and one node agent
per node, each with a pid file under ``run/``; ``down`` stops exactly those, by pid. What
slurm-dev starts itself (agents, the store host, sshd) has its start time in its pid file
beside the pid (:func:`write_pidfile`): a process is taken for ours only while that pid
still has that start time and the command line we gave it (:func:`ours`), whatever it
calls itself meanwhile (an agent that restarted in place from its own venv's interpreter
is ``python3``). The helpers below (pids, users, waiting) serve the store host
(storehost.py), sshd.py and the tests too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from devconfig import INSTALL_ETC, INSTALL_PREFIX, NODE_LOCAL, NODE_ROOT, VENV, ClusterConfig

# Ordinary users, as on a real cluster: tests and the demo submit jobs as them (root only
# where an admin acts). Real accounts (useradd, with home directories), made by `up`.
USERS = ("alice", "bob", "mallory")
AGENT_START_TIMEOUT = 180  # seconds for a node agent to answer on its socket


class Daemons(ClusterConfig):
    """The cluster's processes: pid files, start (idempotent), readiness, stop."""

    def pidfiles(self) -> dict[str, Path]:
        files = {"munged": self.run / "munged.pid", "slurmctld": self.run / "slurmctld.pid"}
        files |= {f"slurmd-{n}": self.run / f"slurmd-{n}.pid" for n in self.s.node_names}
        files |= {f"bootseer-agent-{n}": self.run / f"agent-{n}.pid" for n in self.s.node_names}
        files["weed"] = self.run / "weed.pid"
        return files

    def alive(self, name: str) -> int | None:
        return ours(self.pidfiles()[name], self.command_words(name))

    def command_words(self, name: str) -> tuple[str, ...]:
        """Words the command line of the process ``name`` holds, whatever runs it."""
        if name.startswith("bootseer-agent-"):
            return ("agent", "--node", name.removeprefix("bootseer-agent-"))
        if name.startswith("slurmd-"):
            return ("slurmd", "-N", name.removeprefix("slurmd-"))
        return (name,)  # munged, slurmctld, weed

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
        if self.s.node_fs_gib:
            mount_node_fs(local, self.s.node_fs_gib)
        NODE_LOCAL.mkdir(parents=True, exist_ok=True)
        script = 'hostname "$1" && mount --bind "$3" "$4" && exec slurmd -f "$2" -N "$1"'
        args = ["slurmd", node, str(self.conf), str(local), str(NODE_LOCAL)]
        if self.s.ssh_install:  # and NODE_ROOT its own root, where its install lies
            script = f'mount --bind "$5" "$6" && {script}'
            args += [str(self.node_root(node)), str(NODE_ROOT)]
        # Its network namespace is the node's host on the cluster's bridge (network.py).
        cmd = [*self.s.network.enter(node), "unshare", "--uts", "--mount"]
        cmd += ["--propagation", "unchanged", "sh", "-c", script, *args]
        run_checked(cmd, env=self.env())

    def node_root(self, node: str) -> Path:
        """What ``node`` sees at NODE_ROOT (--install-over-ssh)."""
        return self.dir / "nodes" / node / "root"

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
        # On the node's host, so what it fetches and serves crosses the node's link.
        cmd = [*self.s.network.enter(node), str(VENV / "bin" / "bootseer"), "agent", "--node", node]
        env = {**os.environ, **self.env()}
        if self.s.ssh_install:
            # The node's own install, in its root (mounts under the shared state dir,
            # the image FUSE mount, still reach every side).
            script = 'mount --bind "$1" "$2" && exec "$3" agent --node "$4"'
            cmd = [*self.s.network.enter(node), "unshare", "--mount", "--propagation"]
            cmd += ["unchanged", "sh", "-c", script, "agent", str(self.node_root(node))]
            cmd += [str(NODE_ROOT), str(INSTALL_PREFIX / "venv" / "bin" / "bootseer"), node]
            env["BOOTSEER_CONFIG"] = str(INSTALL_ETC / "config.toml")
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        write_pidfile(self.pidfiles()[name], proc.pid)

        def answers() -> bool:
            if proc.poll() is not None:
                raise SystemExit(f"slurm-dev: the agent of {node} exited; see {log.name}")
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(sock))
                return True
            except OSError:
                return False

        # An agent's start imports pyarrow and the rest: 30 s was passed at load 130-250
        # (the startup bench restarting 16 agents beside other work); busy is not dead.
        wait_for(answers, AGENT_START_TIMEOUT, f"the node agent of {node}")

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
        self.stop_daemons()
        self.unmount_all()
        self.s.network.down()
        print(f"slurm-dev: stopped (state kept in {self.dir})")

    def stop_daemons(self) -> None:
        """Stop every process of a pid file that is still the one started (:func:`ours`)."""
        for name, pidfile in reversed(list(self.pidfiles().items())):
            pid = self.alive(name)
            if pid:
                # SeaweedFS ignores SIGTERM for a long while; nothing of it needs saving.
                stop_pid(pid, name, grace=3 if name == "weed" else 15)
            pidfile.unlink(missing_ok=True)

    def unmount_all(self) -> None:
        """Unmount everything at or below the state dir, deepest first (lazily)."""
        for _ in range(5):  # mounts stacked on one point come off one per pass
            top, below = str(self.dir), str(self.dir) + "/"
            mounts = [m for m in mount_points() if m == top or m.startswith(below)]
            if not mounts:
                return
            for mnt in sorted(set(mounts), reverse=True):
                subprocess.run(["umount", "-l", mnt], capture_output=True)


def mount_node_fs(local: Path, gib: int) -> None:
    """Mount a journaled ext4 of its own on a node's local directory (unless one is):
    ``local.ext4`` beside it, a sparse file of ``gib`` GiB made once and kept with the
    state (``down`` unmounts it with everything below the state dir; ``discard`` gives
    the blocks of deleted files back to the host's disk), on a loop device with direct
    I/O where the kernel allows it.

    A node's local disk has a journal; this machine's root file system has none, and
    ext4 without a journal skips every inode freed in the last 60 s (360 s while its
    inode table block is dirty) when it allocates one: a 16,000-file restore into a
    node's directory took 3-8 s against 1.3-6.7 for `tar` by what other runs and
    sessions had deleted (docs/performance.md, "Nodes with a journaled local disk")."""
    if os.path.ismount(local):
        return
    image = local.parent / "local.ext4"
    if not image.exists():
        with open(image, "wb") as f:
            f.truncate(gib << 30)
        lazy = "lazy_itable_init=1,lazy_journal_init=1"
        run_checked(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", lazy, str(image)])
    run_checked(["mount", "-o", "loop,discard", str(image), str(local)])
    # Past the host's page cache, as a disk is: buffered, the loop device kept every
    # block it read a second time in the host's cache of local.ext4.
    device = subprocess.run(
        ["findmnt", "-n", "-o", "SOURCE", str(local)], capture_output=True, text=True
    ).stdout.strip()
    if device.startswith("/dev/loop"):
        subprocess.run(["losetup", "--direct-io=on", device], capture_output=True)
    local.chmod(0o1777)  # open to every user, like a node's /tmp


# -- users ---------------------------------------------------------------------------------


def ensure_users() -> None:
    """Create the USERS that do not exist yet (safe to run again, and beside another `up`),
    and let them use FUSE (squashfuse of a job's image) as on a stock node, where udev
    makes /dev/fuse 0666; a machine without udev leaves it root's alone."""
    fuse = Path("/dev/fuse")
    if fuse.exists() and fuse.stat().st_mode & 0o777 != 0o666:
        fuse.chmod(0o666)
    # Two `up`s at once (the test suite's workers) would race useradd for /etc/passwd's
    # lock ("cannot lock /etc/passwd; try again later"): one at a time.
    with open("/run/slurm-dev-users.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _add_users()


def _add_users() -> None:
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


def start_time(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (/proc's stat, field 22): ``exec``
    keeps it; a pid used again by another process has another."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def write_pidfile(path: Path, pid: int) -> None:
    """``pid`` and its start time: the process we just started, for :func:`ours`."""
    path.write_text(f"{pid} {start_time(pid)}\n")


def command_line(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def ours(pidfile: Path, words: tuple[str, ...]) -> int | None:
    """The pid in ``pidfile`` if that process runs and is still the one the file was
    written for: the start time recorded there (:func:`write_pidfile`; a daemon that
    writes its own pid file, such as slurmd, records none), and a command line holding
    ``words`` in order, each a whole argument or an argument's file name (``slurmd``
    for ``/usr/sbin/slurmd``). Never by the process's name alone: an agent restarted in
    place from its own venv's interpreter calls itself ``python3``."""
    try:
        fields = pidfile.read_text().split()
        pid = int(fields[0])
        started = int(fields[1]) if len(fields) > 1 and fields[1] != "None" else None
    except (FileNotFoundError, ValueError, IndexError):
        return None
    if not pid_alive(pid):
        return None
    if started is not None and start_time(pid) != started:
        return None  # the pid went to another process
    # Split at blanks too: sshd rewrites its title into one argument
    # ("sshd: /usr/sbin/sshd -D -e -f ... [listener] ...").
    words_seen = [w for arg in command_line(pid) for w in arg.split()]
    args = [a for w in words_seen for a in (w, os.path.basename(w))]
    at = 0
    for word in words:
        try:
            at = args.index(word, at) + 1
        except ValueError:
            return None
    return pid


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
