"""The agent's unix socket: requests one line of JSON each, the caller known by ``SO_PEERCRED``.

A request is one line of JSON in and one out (:mod:`bootseer.agentapi.requests`), a
connection carrying one request after another; :func:`bootseer.agent.handler.handle`
decides what the caller may do. An error travels as its kind, so the client raises the
same exception class the agent did. No thread is started per connection or request:
one selector thread waits on the idle connections and a bounded pool answers
(:class:`AgentServer`).

    >>> server = AgentServer(Path("/run/bootseer/agent.sock"), agent)  # doctest: +SKIP
    >>> threading.Thread(target=server.serve_forever, daemon=True).start()  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bootseer import jsonlimits
from bootseer.agent.assembly import Agent
from bootseer.agent.handler import Caller, handle
from bootseer.agentapi.client import AgentClient
from bootseer.agentapi.errors import (
    AgentBadRequest,
    AgentError,
    AgentRefused,
    AgentUnavailable,
    error_reply,
)
from bootseer.agentapi.jobs import Ping
from bootseer.agentapi.requests import parse_request
from bootseer.agentapi.wire import MAX_LINE, encode
from bootseer.errors import StoreError
from bootseer.jsondecode import DecodeError
from bootseer.workers import Pool


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


MAX_FDS = 1  # descriptors one request may pass (the checkpoint door's file)
# A connection with no request under way is closed after this long (its caller opens a
# new one), and so is one whose request has not come whole in that time: the socket is
# open to every user, and an open connection holds one of their slots.
IDLE_TIMEOUT = 10.0
REPLY_TIMEOUT = 10.0  # a caller that takes none of its reply this long is cut off
# Workers kept for root's requests beyond the users' ``max_connections``: root is never
# refused, and never waits for a worker behind users.
ROOT_WORKERS = 64
BACKLOG = 128  # connections waiting to be accepted (every prolog of a node at once)


def answer(agent: Agent, line: bytes, caller: Caller) -> dict[str, object]:
    """The reply to one request line from ``caller``: the handler's, or an error by kind."""
    try:
        try:
            doc = jsonlimits.loads(line, max_bytes=MAX_LINE, what="request")
        except ValueError as exc:
            raise AgentBadRequest(f"request is not one line of JSON: {exc}") from None
        if len(caller.fds) > MAX_FDS:
            raise AgentBadRequest(f"at most {MAX_FDS} file descriptor with a request")
        request = parse_request(doc)
        return handle(agent, request, caller).to_wire()
    except Exception as exc:
        error = agent_error(exc)
        if error is None:  # a bug, not a refusal: the agent's log keeps it
            agent.log(f"request failed: {exc!r}")
            error = AgentError(f"agent error: {exc!r}")
        return error_reply(error)


# What a failure inside the agent is on the wire, by its class (the first that matches);
# an AgentError is its own kind.
KINDS: tuple[tuple[type[Exception], type[AgentError]], ...] = (
    (DecodeError, AgentBadRequest),
    (StoreError, AgentError),
    (ValueError, AgentError),
)


def agent_error(exc: Exception) -> AgentError | None:
    """``exc`` as the :class:`AgentError` of its kind, with its message; None for a
    failure the agent did not expect."""
    if isinstance(exc, AgentError):
        return exc
    for cls, kind in KINDS:
        if isinstance(exc, cls):
            return kind(str(exc) or type(exc).__name__)
    return None


# A request read whole: its line, the descriptors passed with it, and whether the
# connection closes after its reply (it cannot carry another).
Request = tuple[bytes, list[int], bool]


@dataclass(eq=False)
class _Conn:
    """One open connection: its caller, the bytes of its next request read so far (and the
    descriptors that came with them), and since when it waits (for a request to begin, or
    for the rest of the one begun)."""

    sock: socket.socket
    uid: int
    since: float
    buf: bytearray = field(default_factory=bytearray)
    fds: list[int] = field(default_factory=list)
    eof: bool = False  # the caller will send nothing more

    def take(self) -> Request | None:
        """The next request (its line, its descriptors, and whether the connection must
        close after its reply: it cannot carry another), or None until more is read."""
        at = self.buf.find(b"\n")
        if 0 <= at <= MAX_LINE:
            line, fds = bytes(self.buf[: at + 1]), self.fds
            del self.buf[: at + 1]
            self.fds = []
            return line, fds, len(fds) > MAX_FDS
        if self.eof or len(self.buf) > MAX_LINE or len(self.fds) > MAX_FDS:
            # Answered (a bad request, or the last one's line without its newline), then
            # closed: what follows cannot be told from its remains.
            line, fds = bytes(self.buf[: MAX_LINE + 1]), self.fds
            self.buf.clear()
            self.fds = []
            return (line, fds, True) if line or fds else None
        return None

    def read(self) -> bool:
        """Read what the caller sent, without waiting; False if the connection broke."""
        try:
            data, fds, _flags, _addr = socket.recv_fds(
                self.sock,
                MAX_LINE + 1 - min(len(self.buf), MAX_LINE),
                MAX_FDS + 1,
                socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC,
            )
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        self.fds += fds
        if not data:
            self.eof = True
        self.buf += data
        return True

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []
        self.sock.close()


class AgentServer:
    """The agent's socket, served by one selector thread and a bounded pool of workers.

    The selector thread (:meth:`serve_forever`) accepts, reads requests as their bytes
    come and hands each whole request line to a worker; a connection with nothing under
    way waits in the selector's ``epoll`` set, holding no worker, so an idle user does not
    stop others being served. A connection carries requests one after another, each
    answered before the next is taken: root's callers (the checkpoint daemon, the
    prolog's restore) keep one for their pieces; a caller of an earlier version sends one
    and closes. Users' open connections are capped: never more than ``max_connections``
    at once, nor ``max_per_user`` of one user's; past either, the connection is answered
    ``refused`` at once, by the selector thread, and closed. Root's are always accepted.
    A connection idle for ``idle_timeout`` seconds (no request begun) is closed, and so
    is one whose request has not come whole in that time. The pool has at most
    ``max_connections + ROOT_WORKERS`` threads, started as they are first needed and
    kept: users' requests under way are at most ``max_connections`` (each one's
    connection counts), so root's always find a worker among the rest."""

    def __init__(
        self,
        path: Path,
        agent: Agent,
        max_connections: int = 64,
        max_per_user: int = 8,
        listen: socket.socket | None = None,
        idle_timeout: float = IDLE_TIMEOUT,
    ) -> None:
        """``listen``: the socket an agent restarting in place handed on (already bound
        at ``path``, its backlog holding whoever connected meanwhile)."""
        self.agent = agent
        self.max_connections = max_connections
        self.max_per_user = max_per_user
        self.idle_timeout = idle_timeout
        self.refused = 0  # users' connections answered busy (metrics)
        self.served = 0  # requests answered (tests, benchmarks)
        self._lock = threading.Lock()
        self._open: Counter[int] = Counter()  # uid -> connections open
        self._busy: Counter[int] = Counter()  # uid -> requests being answered
        self._conns: dict[int, _Conn] = {}  # fd -> every open connection
        self._idle: set[_Conn] = set()  # those with no request under way
        self._pool: Pool[tuple[_Conn, Request]] = Pool(
            max_connections + ROOT_WORKERS, self._serve, "agent-request"
        )
        self._stop = False
        self._stopped = threading.Event()
        self._stopped.set()  # not serving
        self._epoll = select.epoll()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        if listen is not None:
            self.socket = listen
        else:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            with contextlib.suppress(AgentUnavailable):
                AgentClient(path).ask(Ping(), timeout=2)
                raise AgentError(f"another agent already answers on {path}")
            path.unlink(missing_ok=True)
            self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                self.socket.bind(str(path))
                self.socket.listen(BACKLOG)
            except BaseException:
                self.socket.close()
                raise
            os.chmod(path, 0o666)  # users may ask about their own jobs; SO_PEERCRED decides
        self.socket.setblocking(False)
        self._epoll.register(self.socket.fileno(), select.EPOLLIN)
        self._epoll.register(self._wake_r.fileno(), select.EPOLLIN)

    # -- the selector thread ------------------------------------------------------

    def serve_forever(self) -> None:
        """Serve until :meth:`shutdown`; the connections stay, for the next call (a
        restart in place that did not happen serves them again)."""
        self._stop = False
        self._stopped.clear()
        listen, wake = self.socket.fileno(), self._wake_r.fileno()
        try:
            while not self._stop:
                for fd, _events in self._epoll.poll(self._next_deadline()):
                    if fd == listen:
                        self._accept()
                    elif fd == wake:
                        with contextlib.suppress(OSError):
                            while self._wake_r.recv(4096):
                                pass
                    else:
                        with self._lock:
                            conn = self._conns.get(fd)
                        if conn is not None:
                            self._readable(conn)
                self._expire()
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop accepting and taking requests, and wait until the selector thread has
        (requests under way are still answered; connections stay open)."""
        self._stop = True
        with contextlib.suppress(OSError):  # full: the selector wakes anyway
            self._wake_w.send(b"x")
        self._stopped.wait()

    def server_close(self) -> None:
        """Close the listening socket and every connection with nothing under way."""
        self.socket.close()
        with self._lock:
            idle, self._idle = list(self._idle), set()
        for conn in idle:
            self._close(conn)
        self._pool.stop()
        self._epoll.close()
        self._wake_r.close()
        self._wake_w.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # closed (the agent is stopping), or a connection gone already
            try:
                uid = peer_uid(sock)
            except OSError:
                sock.close()
                continue
            with self._lock:
                users = sum(n for u, n in self._open.items() if u != 0)
                if uid != 0 and self._open[uid] >= self.max_per_user:
                    why = (
                        f"uid {uid} has {self._open[uid]} connections open, "
                        f"at most {self.max_per_user}"
                    )
                elif uid != 0 and users >= self.max_connections:
                    why = f"{users} connections of users open, at most {self.max_connections}"
                else:
                    why = ""
                    self._open[uid] += 1
                    conn = _Conn(sock, uid, time.monotonic())
                    self._conns[sock.fileno()] = conn
                    self._idle.add(conn)
            if why:
                self._refuse(sock, why)
                continue
            sock.settimeout(REPLY_TIMEOUT)  # a reply the caller does not take in time
            self._epoll.register(sock.fileno(), WAIT)

    def _readable(self, conn: _Conn) -> None:
        """Take what came on an idle connection: a whole request goes to a worker."""
        if not conn.read():
            self._drop(conn)
            return
        request = conn.take()
        if request is None:
            if conn.eof:  # closed by the caller, nothing asked
                self._drop(conn)
            else:
                self._epoll.modify(conn.sock.fileno(), WAIT)  # the rest of it
            return
        with self._lock:
            self._idle.discard(conn)
            self._busy[conn.uid] += 1
        self._pool.submit((conn, request))

    def _next_deadline(self) -> float:
        """Seconds until the next idle connection idles out. With none idle, one handed
        back by a worker meanwhile (not waking this thread: no hand-off per request) is
        looked at within ``idle_timeout``; :meth:`shutdown` wakes the thread itself."""
        with self._lock:
            oldest = min((c.since for c in self._idle), default=None)
        if oldest is None:
            return self.idle_timeout
        return max(0.0, oldest + self.idle_timeout - time.monotonic())

    def _expire(self) -> None:
        """Close connections idle for ``idle_timeout`` (their caller opens a new one) and
        those whose request did not come whole in that time."""
        limit = time.monotonic() - self.idle_timeout
        with self._lock:
            old = [c for c in self._idle if c.since <= limit]
        for conn in old:
            self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        with self._lock:
            self._idle.discard(conn)
        self._close(conn)

    def _refuse(self, sock: socket.socket, why: str) -> None:
        with self._lock:
            self.refused += 1
        with contextlib.suppress(OSError):
            sock.send(encode(error_reply(AgentRefused(f"busy: {why}"))), socket.MSG_DONTWAIT)
        sock.close()

    # -- the workers --------------------------------------------------------------

    def _serve(self, item: tuple[_Conn, Request]) -> None:
        """Answer a connection's request (and the next ones if already read), then give
        the connection back to the selector, or close it."""
        conn, request = item
        close = True
        try:
            while True:
                line, fds, last = request
                if not self._answer(conn, line, fds) or last:
                    return
                got = conn.take()
                if got is None:
                    close = conn.eof
                    return
                request = got
        except Exception as exc:  # a bug: the agent's log keeps it, the caller is cut off
            self.agent.log(f"agent socket: {exc!r}")
        finally:
            with self._lock:
                self._busy[conn.uid] -= 1
                if self._busy[conn.uid] <= 0:
                    del self._busy[conn.uid]
                if not close:
                    conn.since = time.monotonic()
                    self._idle.add(conn)
            if close:
                self._close(conn)
            else:
                try:
                    self._epoll.modify(conn.sock.fileno(), WAIT)  # its next request
                except (OSError, ValueError):  # the agent is stopping (its epoll closed)
                    self._drop(conn)

    def _answer(self, conn: _Conn, line: bytes, fds: list[int]) -> bool:
        """Answer one request; False if the reply could not be sent whole."""
        caller = Caller(conn.uid, fds, conn.sock)
        try:
            reply = encode(answer(self.agent, line, caller))
            with self._lock:  # counted before it is sent: the caller may count at once
                self.served += 1
            try:
                if caller.reply_fds:  # with the reply's first bytes, as SCM_RIGHTS
                    reply = reply[socket.send_fds(conn.sock, [reply], caller.reply_fds) :]
                conn.sock.sendall(reply)
            except OSError:
                return False
            return True
        finally:
            for fd in [*fds, *caller.reply_fds]:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _close(self, conn: _Conn) -> None:
        with self._lock:
            if self._conns.get(conn.sock.fileno()) is conn:
                del self._conns[conn.sock.fileno()]
            self._open[conn.uid] -= 1
            if self._open[conn.uid] <= 0:
                del self._open[conn.uid]
        conn.close()  # leaves the epoll set with its last descriptor

    def connections(self) -> dict[int, int]:
        """Requests being answered, by uid (an idle connection kept open is not one)."""
        with self._lock:
            return dict(self._busy)

    def open_connections(self) -> dict[int, int]:
        """Connections open, by uid: what the caps count."""
        with self._lock:
            return dict(self._open)

    def threads(self) -> int:
        """Worker threads started so far (they are kept)."""
        return self._pool.started


# An idle connection waits for its next bytes; once they come it is taken off the wait
# (one-shot) until the request is answered or more of it is read.
WAIT = select.EPOLLIN | select.EPOLLONESHOT
