"""The checkpoint door: the node agent (root) does a user's ``bootseer ckpt``, in that
user's namespaces only.

Why the agent and not the job's mount daemon, nor credentials per user
(docs/security.md, "The checkpoint door"): the agent runs on every node, inside and
outside jobs, already knows each caller by ``SO_PEERCRED`` and caps each user's
connections; it holds the store credentials and the site key, so what a user saves is
sealed like what a job saves through its mount. The namespace is
``<user name of the caller's uid>/<ns>``: nothing in the request names the user.

Who may use it is the site's (``[ckpt] door``): by default a user with a job on the
node (:func:`admit`: the agent's prepared jobs, else Slurm's ``squeue`` for the
node, asked at most every :data:`USERS_TTL` seconds), so no user without a job fills
the targets; ``any`` opens it to every user who reaches the socket, ``off`` to none.

File contents travel through a descriptor the caller opened (``SCM_RIGHTS``): the agent
never opens a user's path. It polls that descriptor together with the connection, so
a caller that goes away, or a pipe that stays silent for :data:`IDLE_SECONDS`, ends
the request (a ``put`` then keeps the previous version) and frees its thread.

    >>> serve(cfg, keys, CkptList("llama-25b"), Caller(1001, [], conn))  # doctest: +SKIP
    CkptListReply(entries=[{'name': 'step100', 'is_dir': True, ...}], left_out=0)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import socket
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

from bootseer.agentapi.ckpt import (
    MAX_ENTRIES,
    MAX_PROBLEMS,
    CkptGet,
    CkptList,
    CkptPut,
    CkptRemove,
    CkptRequest,
    CkptUsage,
    CkptVerify,
)
from bootseer.agentapi.errors import AgentBadRequest, AgentError, AgentNotFound, AgentRefused
from bootseer.agentapi.wire import Reply
from bootseer.ckpt import actions
from bootseer.ckpt.errors import CkptError, CkptPathError, CkptQuotaExceeded
from bootseer.ckpt.names import namespace_name
from bootseer.ckpt.namespace import Namespace
from bootseer.config import SiteConfig
from bootseer.errors import BootseerError, StoreError
from bootseer.sitekey import SiteKeys

# A transfer holds about (read_ahead + 4) or (max_inflight + 1) units of memory in the
# agent: at most this many at once, of one user's and in all, with a short read-ahead.
MAX_TRANSFERS = 4
MAX_TRANSFERS_PER_USER = 2
READ_AHEAD = 4


class _Transfers:
    """Counts the requests under way (put, get, verify, ls, rm), by uid; past a cap, "busy"."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_uid: Counter[int] = Counter()

    @contextlib.contextmanager
    def slot(self, uid: int) -> Iterator[None]:
        with self._lock:
            if self._by_uid[uid] >= MAX_TRANSFERS_PER_USER:
                raise AgentRefused(
                    f"busy: uid {uid} has {self._by_uid[uid]} checkpoint transfers under way, "
                    f"at most {MAX_TRANSFERS_PER_USER}"
                )
            if sum(self._by_uid.values()) >= MAX_TRANSFERS:
                raise AgentRefused(
                    f"busy: {MAX_TRANSFERS} checkpoint transfers under way on this node; retry"
                )
            self._by_uid[uid] += 1
        try:
            yield
        finally:
            with self._lock:
                self._by_uid[uid] -= 1
                if self._by_uid[uid] <= 0:
                    del self._by_uid[uid]


TRANSFERS = _Transfers()

USERS_TTL = 5.0  # seconds a node's list of users with jobs is trusted (one squeue)


class _NodeUsers:
    """The users with a job on a node, from Slurm, asked at most every USERS_TTL: a
    user without a job who asks again and again costs slurmctld one squeue per TTL."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at = float("-inf")
        self._node = ""
        self._users: frozenset[int] = frozenset()
        self._error = ""

    def get(self, cfg: SiteConfig, node: str) -> tuple[frozenset[int], str]:
        from bootseer.slurmjobs import SlurmUnavailable, node_users

        with self._lock:
            if node != self._node or time.monotonic() - self._at > USERS_TTL:
                try:
                    self._users, self._error = (
                        node_users(node, cfg.phases.squeue, cfg.phases.squeue_timeout),
                        "",
                    )
                except SlurmUnavailable as exc:
                    self._users, self._error = frozenset(), str(exc)
                self._node, self._at = node, time.monotonic()
            return self._users, self._error


NODE_USERS = _NodeUsers()


def admit(cfg: SiteConfig, node: str, uid: int, prepared: Collection[int] = ()) -> None:
    """Whether ``uid`` may use the door on ``node`` under ``[ckpt] door``; AgentRefused
    if not. ``prepared``: the uids of the jobs the agent prepared here (no squeue)."""
    mode = cfg.ckpt.door
    if uid == 0 or mode == "any":
        return
    if mode == "off":
        raise AgentRefused(
            f'the checkpoint door is closed on {node} ([ckpt] door = "off"): use '
            "the job's checkpoint mount (--bootseer-ckpt)"
        )
    if uid in prepared:
        return
    users, error = NODE_USERS.get(cfg, node)
    if uid in users:
        return
    why = f" (Slurm could not say: {error})" if error else ""
    raise AgentRefused(
        f"uid {uid} has no job on {node}{why}: the checkpoint door serves users with a job "
        'on the node ([ckpt] door = "job"); run `bootseer ckpt` inside your job'
    )


@dataclass
class Caller:
    """Who asks (by ``SO_PEERCRED``), the descriptors they passed, their connection."""

    uid: int
    fds: list[int] = field(default_factory=list)
    conn: socket.socket | None = None
    log: Callable[[str], None] | None = None  # the agent's log: what a door wrote, and for whom


def current_config(cfg: SiteConfig, node: str) -> SiteConfig:
    """The site config as it is now: an admin may change ``[ckpt] targets`` without
    restarting the agents (the agent's own copy, if the file cannot be read)."""
    if cfg.source is None:
        return cfg
    from bootseer.config import load_config

    try:
        return load_config(cfg.source).for_node(node)
    except BootseerError:
        return cfg


def serve(cfg: SiteConfig, keys: SiteKeys, req: CkptRequest[Any], caller: Caller) -> Reply:
    """Do ``req`` in the caller's namespace; an :class:`AgentError` kind for every refusal."""
    try:
        user = pwd.getpwuid(caller.uid).pw_name
    except KeyError:
        raise AgentRefused(f"uid {caller.uid} has no user name: no checkpoint namespace") from None
    name = req.ns
    try:
        if isinstance(req, CkptUsage):
            _descriptor(req, caller)
            with TRANSFERS.slot(caller.uid):
                return actions.usage(cfg, user)
        name = namespace_name(user, req.ns)
        fd = _descriptor(req, caller)
        ns = Namespace.from_config(cfg, name, keys=keys)
        ns.read_ahead = min(ns.read_ahead, READ_AHEAD)
        if isinstance(req, CkptPut):
            from bootseer.ckpt.quota import guard_for

            ns.quota = guard_for(cfg, ns.targets, user, caller.log)
        # Every request is store work done as root: a verify reads every unit it checks,
        # an ls up to MAX_ENTRIES manifests, an rm up to MAX_PATHS removals. Each holds
        # one of the caller's transfers, so none runs past her share.
        with TRANSFERS.slot(caller.uid):
            reply = ACTIONS[type(req)](ns, req, fd, caller.conn)
        if caller.log is not None and isinstance(req, CkptPut | CkptRemove):
            what = req.path if isinstance(req, CkptPut) else " ".join(req.paths)
            caller.log(f"ckpt door: uid {caller.uid} {req.op} {name}: {what}: {reply}")
        return reply
    except CkptPathError as exc:
        raise AgentBadRequest(str(exc)) from None
    except actions.BadDescriptor as exc:
        raise AgentRefused(str(exc)) from None
    except FileNotFoundError as exc:
        raise AgentNotFound(exc.strerror or str(exc)) from None
    except (CkptError, StoreError) as exc:
        if isinstance(exc, CkptQuotaExceeded) and caller.log is not None:
            caller.log(f"ckpt door: uid {caller.uid} {req.op} {name} refused: {exc}")
        raise AgentError(str(exc)) from None
    except OSError as exc:
        raise AgentError(f"{name}: {exc.strerror or exc}") from None


def _descriptor(req: CkptRequest[Any], caller: Caller) -> int:
    """The one descriptor ``req`` needs, opened by the caller for what it needs."""
    if not req.fd_mode:
        if caller.fds:
            raise AgentBadRequest(f"{req.op} takes no file descriptor")
        return -1
    if len(caller.fds) != 1:
        raise AgentBadRequest(f"{req.op} needs exactly one file descriptor (SCM_RIGHTS)")
    fd = caller.fds[0]
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    access = flags & os.O_ACCMODE
    want = (os.O_RDONLY, os.O_RDWR) if req.fd_mode == "r" else (os.O_WRONLY, os.O_RDWR)
    if access not in want or flags & getattr(os, "O_PATH", 0):
        what = "reading" if req.fd_mode == "r" else "writing"
        raise AgentRefused(f"{req.op}: the file descriptor is not open for {what}")
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
        raise AgentRefused(f"{req.op}: the file descriptor is a directory")
    if req.fd_mode == "w" and not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        # Root's writes pass the user's disk quota and take the blocks a filesystem
        # keeps for root: the caller writes its own files (``bootseer ckpt get`` does).
        raise AgentRefused(
            f"{req.op}: the file descriptor must be a pipe or a socket (the agent writes "
            "no user's file: the caller copies from the pipe, as `bootseer ckpt get` does)"
        )
    return fd


# The door's action for each request: the same functions root's CLI calls
# (bootseer.ckpt.actions), in the caller's namespace, on the descriptor she passed,
# watching her connection.
Action = Callable[[Namespace, Any, int, socket.socket | None], Reply]
ACTIONS: dict[type[CkptRequest[Any]], Action] = {
    CkptPut: lambda ns, req, fd, watch: actions.put(ns, req.path, fd, watch),
    CkptGet: lambda ns, req, fd, watch: actions.get(ns, req.path, fd, watch),
    CkptList: lambda ns, req, fd, watch: actions.ls(ns, req.path, MAX_ENTRIES),
    CkptRemove: lambda ns, req, fd, watch: actions.rm(ns, req.paths),
    CkptVerify: lambda ns, req, fd, watch: actions.verify(ns, req.path, MAX_PROBLEMS),
}
