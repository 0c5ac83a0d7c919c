"""The checkpoint door: the node agent (root) does a user's ``bootseer ckpt``, in that
user's namespaces only.

Why the agent and not the job's mount daemon, nor credentials per user
(docs/security.md, "The checkpoint door"): the agent runs on every node, inside and
outside jobs, already knows each caller by ``SO_PEERCRED`` and caps each user's
connections; it holds the store credentials and the site key, so what a user saves is
sealed like what a job saves through its mount. The namespace is
``<user name of the caller's uid>/<ns>``: nothing in the request names the user.

File contents travel through a descriptor the caller opened (``SCM_RIGHTS``): the agent
never opens a user's path. It polls that descriptor together with the connection, so
a caller that goes away, or a pipe that stays silent for :data:`IDLE_SECONDS`, ends
the request (a ``put`` then keeps the previous version) and frees its thread.

    >>> serve(cfg, keys, CkptList("llama-25b"), Caller(1001, [], conn))  # doctest: +SKIP
    CkptListReply(entries=[{'name': 'step100', 'is_dir': True, ...}], left_out=0)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pwd
import select
import socket
import stat
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from bootseer.agentapi.ckpt import (
    MAX_ENTRIES,
    MAX_PROBLEMS,
    CkptGet,
    CkptGetReply,
    CkptList,
    CkptListReply,
    CkptPut,
    CkptPutReply,
    CkptRemove,
    CkptRemoveReply,
    CkptRequest,
    CkptUsage,
    CkptUsageReply,
    CkptVerify,
    CkptVerifyReply,
    UsageRow,
)
from bootseer.agentapi.errors import AgentBadRequest, AgentError, AgentNotFound, AgentRefused
from bootseer.agentapi.wire import Reply
from bootseer.ckpt.errors import CkptError, CkptIOError, CkptPathError, CkptQuotaExceeded
from bootseer.ckpt.names import check_path, namespace_name
from bootseer.ckpt.namespace import Namespace
from bootseer.ckpt.reader import StripedReader
from bootseer.config import SiteConfig
from bootseer.errors import BootseerError, StoreError
from bootseer.sitekey import SiteKeys

CHUNK = 8 << 20  # as root's own ckpt CLI copies
PIPE_CHUNK = 4096  # at most PIPE_BUF after POLLOUT: a write to a pipe never blocks
IDLE_SECONDS = 300.0
# A transfer holds about (read_ahead + 2) or (max_inflight + 1) units of memory in the
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
                return _usage(cfg, user)
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
            reply = _do(ns, req, fd, caller)
        if caller.log is not None and isinstance(req, CkptPut | CkptRemove):
            what = req.path if isinstance(req, CkptPut) else " ".join(req.paths)
            caller.log(f"ckpt door: uid {caller.uid} {req.op} {name}: {what}: {reply}")
        return reply
    except CkptPathError as exc:
        raise AgentBadRequest(str(exc)) from None
    except FileNotFoundError as exc:
        raise AgentNotFound(exc.strerror or str(exc)) from None
    except (CkptError, StoreError) as exc:
        if isinstance(exc, CkptQuotaExceeded) and caller.log is not None:
            caller.log(f"ckpt door: uid {caller.uid} {req.op} {name} refused: {exc}")
        raise AgentError(str(exc)) from None
    except OSError as exc:
        raise AgentError(f"{name}: {exc.strerror or exc}") from None


def _usage(cfg: SiteConfig, user: str) -> CkptUsageReply:
    from bootseer.ckpt.quota import usage

    stores = []
    for uri in cfg.ckpt.targets:
        try:
            stores.append(cfg.store.open_uri(uri))
        except StoreError as exc:
            raise CkptError(f"checkpoint target {uri} is not reachable: {exc}") from None
    return CkptUsageReply([UsageRow(**asdict(u)) for u in usage(cfg, stores, user)])


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


def _do(ns: Namespace, req: CkptRequest[Any], fd: int, caller: Caller) -> Reply:
    if isinstance(req, CkptPut):
        check_path(req.path)
        with ns.open(req.path, "wb") as out:
            n = _pump(fd, out.write, caller.conn)
            m = out.commit()
        return CkptPutReply(n, m.version, m.unit_count)
    if isinstance(req, CkptGet):
        with ns.open(req.path) as f:
            n = _send(f, fd, caller.conn)
            return CkptGetReply(n, f.manifest.version)
    if isinstance(req, CkptList):
        from bootseer.ckpt.listing import list_path

        if req.path:
            check_path(req.path)
        found, more = list_path(ns, req.path, MAX_ENTRIES)  # ENOENT: nothing there
        return CkptListReply(found, more)
    if isinstance(req, CkptRemove):
        for path in req.paths:
            ns.remove(check_path(path))
        return CkptRemoveReply(len(req.paths))
    if isinstance(req, CkptVerify):
        paths = [req.path] if req.path and not ns.is_dir(req.path) else list(ns.walk(req.path))
        problems: list[str] = []
        total = 0
        for p in paths:
            try:
                fm = ns.manifest(p)
                total += fm.size if fm is not None else 0
                problems += ns.verify_file(p)
            except CkptIOError as exc:  # a manifest that does not verify is a problem
                problems.append(str(exc))
        return CkptVerifyReply(
            len(paths), total, problems[:MAX_PROBLEMS], max(0, len(problems) - MAX_PROBLEMS)
        )
    raise AgentBadRequest(f"op {req.op!r} has no handler")


def _wait(fd: int, event: int, conn: socket.socket | None) -> None:
    """Until ``fd`` is ready for ``event``; the caller gone or silent ends the request."""
    p = select.poll()
    p.register(fd, event)
    if conn is not None:
        p.register(conn, select.POLLIN | select.POLLRDHUP)
    ready = dict(p.poll(IDLE_SECONDS * 1000))
    if not ready:
        raise AgentError(f"no data moved for {IDLE_SECONDS:g}s: request abandoned")
    if conn is not None and conn.fileno() in ready:
        # The client sends nothing after its request: readable means it went away.
        raise AgentError("the client went away: request abandoned")


def _pump(fd: int, write: Callable[[memoryview], object], conn: socket.socket | None) -> int:
    """Copy the caller's descriptor to ``write`` until its end; the bytes copied."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    total = 0
    while True:
        _wait(fd, select.POLLIN, conn)
        try:
            n = os.readv(fd, [buf])
        except BlockingIOError:
            continue
        if not n:
            return total
        write(view[:n])
        total += n


def _send(reader: StripedReader, fd: int, conn: socket.socket | None) -> int:
    """Write the reader's bytes into the caller's descriptor; the bytes written."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    total = 0
    while True:
        n = reader.readinto(buf)
        if not n:
            return total
        chunk = view[:n]
        while chunk:
            _wait(fd, select.POLLOUT, conn)
            try:
                w = os.write(fd, chunk[:PIPE_CHUNK])  # fd: a pipe or a socket (_descriptor)
            except BlockingIOError:
                continue
            except BrokenPipeError:
                raise AgentError("the reader of the output went away") from None
            except OSError as exc:
                if exc.errno in (errno.EBADF, errno.EINVAL):
                    raise AgentRefused(f"cannot write the descriptor: {exc.strerror}") from None
                raise
            chunk = chunk[w:]
            total += w
