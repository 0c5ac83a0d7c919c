"""The agent's restart in place, for an upgrade or a new config: only when no job uses it.

A job's image is a file in the agent's FUSE mount: a job that opened it (squashfuse,
Apptainer) loses it when the agent process ends, whatever a new agent brings back. So
an agent restarts only when it is idle: no prepared image (:class:`~bootseer.agent.jobs.Jobs`),
no job dir on the node (``<run_dir>/jobs/<job>``: a bootseer job between its prolog and
epilog, whose checkpoint mount or dependency restore asks the agent for pieces), and no
request of root's in flight (a hook's). Asked while jobs run
(:class:`~bootseer.agentapi.jobs.AgentRestart` with ``when_idle``), it answers
``pending`` with their ids and restarts once they are gone; meanwhile it sweeps what
epilogs left of jobs Slurm no longer runs here (:mod:`bootseer.agent.sweep`), which would
hold it for good.

The restart keeps the process: the agent stops accepting connections, gives those in
flight up to :data:`DRAIN` seconds (a user's still open then, such as a checkpoint
transfer or one that trickles its request in, is cut off: a user cannot hold every
upgrade back), looks once more, then unmounts its FUSE mount (a new one is mounted by the
new program, never stacked on a stale one), stops its threads and ``exec``s its own
command line again, through the install's ``venv`` link, so the new venv runs. The pid
stays (systemd's main pid, slurm-dev's pid file), and so does the listening socket: it
is inherited across ``exec`` (:data:`LISTEN_FD`), so a prolog that connects meanwhile
waits in the socket's backlog for the new agent instead of finding no agent::

    >>> h = Handover(agent, server, job_dirs=Path("/run/bootseer/jobs"))  # doctest: +SKIP
    >>> h.request(when_idle=True, own=1).state  # doctest: +SKIP
    'pending'
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

from bootseer.agentapi.jobs import RestartReply
from bootseer.errors import describe

if TYPE_CHECKING:
    from bootseer.agent.assembly import Agent
    from bootseer.agent.server import AgentServer
    from bootseer.agentapi.client import AgentClient

# The listening socket's descriptor, and the pid it is meant for (as systemd's
# LISTEN_FDS/LISTEN_PID: a child that inherits the environment must not take it).
LISTEN_FD = "BOOTSEER_AGENT_LISTEN_FD"
LISTEN_PID = "BOOTSEER_AGENT_LISTEN_PID"
PENDING_POLL = 2.0  # seconds between looks while a restart waits for jobs to end
# Seconds the requests in flight get to finish once accepting stopped (a reply just
# sent, a user's checkpoint transfer); past it, a root's still open keeps the agent as
# it is (it serves again), users' are cut off.
DRAIN = 10.0


@dataclass(frozen=True)
class Users:
    """What uses the agent now: jobs, and requests in flight (root's: the hooks', which a
    restart waits for; users': which get :data:`DRAIN` seconds, then are cut off)."""

    jobs: list[int]
    connections: int  # root's
    user_connections: int = 0

    def __bool__(self) -> bool:
        return bool(self.jobs or self.connections)


class Handover:
    """One agent's restart: when to, and what passes to the new program."""

    def __init__(self, agent: Agent, server: AgentServer, job_dirs: Path) -> None:
        self.agent = agent
        self.server = server
        self.job_dirs = job_dirs
        self.going = False  # the main loop ends to restart
        self.pending = False
        self._lock = threading.Lock()
        self._stop: Callable[[], None] | None = None
        self._closed = threading.Event()

    def on_stop(self, stop: Callable[[], None]) -> None:
        """``stop`` ends the agent's main loop (the FUSE session), from any thread."""
        self._stop = stop

    def users(self, own: int = 0) -> Users:
        """``own``: connections of the asker itself, not counted."""
        jobs = set(self.agent.jobs.ids())
        with contextlib.suppress(OSError):
            jobs |= {int(d.name) for d in self.job_dirs.iterdir() if d.name.isdigit()}
        conns = self.server.connections()
        root = conns.pop(0, 0) - own
        return Users(sorted(jobs), max(0, root), sum(conns.values()))

    def request(self, when_idle: bool, own: int = 1) -> RestartReply:
        """Restart now if idle; else, with ``when_idle``, as soon as it is."""
        users = self._try(own)
        if not users:
            return RestartReply("restarting", [], 0)
        if when_idle and not self.pending:
            self.pending = True
            self.agent.log(f"restart pending: jobs {users.jobs}, {users.connections} requests")
            threading.Thread(target=self._wait_idle, name="agent-restart", daemon=True).start()
        return RestartReply("pending" if self.pending else "busy", users.jobs, users.connections)

    def close(self) -> None:
        self._closed.set()

    def replied(self, timeout: float = 10.0) -> None:
        """Wait for root's requests still being answered (the restart request's own
        reply) before the program is replaced: ``exec`` would end their threads."""
        deadline = time.monotonic() + timeout
        while self.server.connections().get(0, 0) and time.monotonic() < deadline:
            time.sleep(0.01)

    def _wait_idle(self) -> None:
        while self.pending and not self._closed.wait(PENDING_POLL):
            # A job dir an epilog left behind (killed, or never run) would hold the
            # restart for good: what Slurm no longer runs here is swept (rate-bounded).
            self.agent.sweeper.maybe()
            if not self._try(0):
                return

    def _try(self, own: int) -> Users:
        with self._lock:
            if self.going:
                return Users([], 0)
            users = self.users(own)
            if users.jobs:
                return users
            # Nothing new is accepted from here; what connects meanwhile waits in the
            # backlog, for this agent again or for the new one.
            self.server.shutdown()
            deadline = time.monotonic() + DRAIN
            while time.monotonic() < deadline:
                now = self.users(own)
                if not now.connections and not now.user_connections:
                    break
                time.sleep(0.05)
            # A user's request still open past DRAIN is cut off by the restart (a door
            # transfer then fails; a version is committed whole or not at all): one that
            # never ends must not hold every upgrade back.
            users = self.users(own)
            if users or self._stop is None:
                threading.Thread(
                    target=self.server.serve_forever, name="agent-socket", daemon=True
                ).start()
                return users or Users([], 1)
            self.going = True
            self.pending = False
            cut = f", {users.user_connections} users' requests cut off" * bool(
                users.user_connections
            )
            self.agent.log(f"restarting: no job uses the agent{cut}")
            self._stop()
            return users


def inherited(path: Path) -> socket.socket | None:
    """The listening socket an agent restarting in place left to this program (the same
    pid), if it is the unix socket at ``path``; the environment forgets it either way."""
    fd, pid = os.environ.pop(LISTEN_FD, ""), os.environ.pop(LISTEN_PID, "")
    if not fd.isdigit() or pid != str(os.getpid()):
        return None
    try:
        sock = socket.socket(fileno=int(fd))
    except OSError:
        return None
    try:
        ok = (
            sock.family == socket.AF_UNIX
            and sock.type == socket.SOCK_STREAM
            and sock.getsockname() == str(path)
            and stat.S_ISSOCK(os.stat(path).st_mode)
        )
    except OSError:
        ok = False
    if not ok:
        sock.close()
        return None
    sock.set_inheritable(False)
    return sock


def exec_again(listen: socket.socket) -> None:
    """Run this program again in this process, ``listen`` passed on. Never returns.

    Started as a script (the install's ``<prefix>/venv/bin/bootseer``), the script is
    run again by its path, so the ``venv`` link and the script's own interpreter line
    choose the new venv; started as ``python -c``/``-m`` (tests), or when the script
    cannot be run, the same command line with this interpreter."""
    fd = listen.fileno()
    os.set_inheritable(fd, True)
    env = {**os.environ, LISTEN_FD: str(fd), LISTEN_PID: str(os.getpid())}
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    script = sys.argv[0]
    if os.path.isfile(script) and os.access(script, os.X_OK) and not script.endswith(".py"):
        try:
            os.execve(script, sys.argv, env)
        except OSError as exc:
            # The new install's script cannot run (its interpreter is gone): this
            # program's own interpreter and venv, which the install keeps, run again.
            print(
                f"bootseer agent: cannot run {script} again ({describe(exc)}); "
                "the same venv instead",
                file=sys.stderr,
                flush=True,
            )
    os.execve(sys.executable, sys.orig_argv, env)


# -- the asking side (``bootseer agent --restart``, run on the node) ---------------------


HandoverState = Literal[
    "restarted", "pending", "busy", "current", "not_running", "unsupported", "failed"
]
HANDOVER_STATES: tuple[HandoverState, ...] = get_args(HandoverState)


@dataclass(frozen=True)
class Outcome:
    """What became of a restart asked for: ``restarted``, ``pending``, ``busy``,
    ``current`` (the agent runs this bootseer already), ``not_running``, ``unsupported``
    (an agent from before restarts in place), or ``failed``."""

    state: HandoverState
    jobs: tuple[int, ...] = ()
    connections: int = 0
    prefix: str = ""  # what the agent runs from (after the restart, if it did)
    detail: str = ""

    def line(self) -> str:
        if self.state in ("restarted", "current"):
            return f"agent {self.state}"
        if self.state in ("pending", "busy"):
            why = [f"jobs {', '.join(map(str, self.jobs))}"] if self.jobs else []
            why += [f"{self.connections} requests open"] if self.connections else []
            users = " and ".join(why) or "its users"
            if self.state == "pending":
                return f"agent restarts once {users} end"
            return f"agent not restarted: {users} use it"
        if self.state == "not_running":
            return "agent not running"
        return f"agent not restarted: {self.detail}"


def ask_restart(
    client: AgentClient, force: bool, when_idle: bool = True, wait: float = 120.0
) -> Outcome:
    """Restart the agent behind ``client`` if it runs another install than this program
    (``sys.prefix``), or with ``force`` (a new config); wait up to ``wait`` seconds for
    the new program to answer."""
    from bootseer.agentapi.errors import AgentBadRequest, AgentError, AgentUnavailable
    from bootseer.agentapi.jobs import AgentRestart, Ping

    here = os.path.realpath(sys.prefix)
    try:
        before = client.ask(Ping(), timeout=10)
    except AgentUnavailable as exc:
        return Outcome("not_running", detail=str(exc))
    if before.prefix == here and not force:
        return Outcome("current", prefix=before.prefix)
    if not before.prefix:
        return Outcome(
            "unsupported",
            detail="this agent is from before restarts in place: restart its service "
            "when no job runs (systemctl restart bootseer-agent)",
        )
    try:
        reply = client.ask(AgentRestart(when_idle), timeout=DRAIN + 30)
    except AgentBadRequest as exc:
        return Outcome("unsupported", detail=str(exc))
    except AgentError as exc:
        return Outcome("failed", detail=str(exc))
    if reply.state != "restarting":
        return Outcome(reply.state, tuple(reply.jobs), reply.connections, before.prefix)
    # The request waits in the inherited socket's backlog until the new program serves.
    deadline = time.monotonic() + wait
    last = ""
    while time.monotonic() < deadline:
        try:
            now = client.ask(Ping(), timeout=max(1.0, deadline - time.monotonic()))
        except AgentError as exc:
            last = str(exc)
            time.sleep(0.2)
            continue
        if now.started != before.started:
            return Outcome("restarted", prefix=now.prefix)
        time.sleep(0.2)
    return Outcome("failed", detail=f"no new agent answered within {wait:g}s {last}".strip())
