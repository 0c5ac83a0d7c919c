"""The agent's unix socket: one request per connection, the caller known by ``SO_PEERCRED``.

Each connection is one line of JSON in and one out (:mod:`bootseer.agentapi.requests`);
:func:`bootseer.agent.handler.handle` decides what the caller may do. An error
travels as its kind, so the client raises the same exception class the agent did.

    >>> server = AgentServer(Path("/run/bootseer/agent.sock"), agent)  # doctest: +SKIP
    >>> threading.Thread(target=server.serve_forever, daemon=True).start()  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import socket
import socketserver
import struct
import threading
from collections import Counter
from pathlib import Path
from typing import Any

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


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


MAX_FDS = 1  # descriptors one request may pass (the checkpoint door's file)


def read_request(sock: socket.socket, fds: list[int]) -> bytes:
    """The request line (up to ``MAX_LINE + 1`` bytes) and, into ``fds``, the descriptors
    passed with it (``SCM_RIGHTS``, close-on-exec: never inherited by the agent's
    children). The caller closes ``fds``; extra ones past the first message's room are
    dropped by the kernel, and more than :data:`MAX_FDS` in all refuse the request."""
    buf = b""
    while b"\n" not in buf and len(buf) <= MAX_LINE:
        data, got, _flags, _addr = socket.recv_fds(
            sock, MAX_LINE + 1 - len(buf), MAX_FDS + 1, socket.MSG_CMSG_CLOEXEC
        )
        fds += got
        if not data or len(fds) > MAX_FDS:  # no collecting descriptors message by message
            break
        buf += data
    return buf.split(b"\n", 1)[0] + b"\n" if b"\n" in buf else buf


class _Handler(socketserver.StreamRequestHandler):
    server: AgentServer
    # The socket is open to every user: an idle connection must not hold a thread forever.
    timeout = 10.0

    def handle(self) -> None:
        uid = peer_uid(self.request)
        fds: list[int] = []
        caller = Caller(uid, fds, self.request)
        try:
            try:
                line = read_request(self.request, fds)
            except OSError:
                return
            with contextlib.suppress(OSError):
                reply = encode(self.answer(line, caller))
                if caller.reply_fds:  # with the reply's first bytes, as SCM_RIGHTS
                    reply = reply[socket.send_fds(self.request, [reply], caller.reply_fds) :]
                self.wfile.write(reply)
        finally:
            for fd in [*fds, *caller.reply_fds]:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def answer(self, line: bytes, caller: Caller) -> dict[str, object]:
        agent = self.server.agent
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


class AgentServer(socketserver.ThreadingUnixStreamServer):
    """A thread per connection, but never more than ``max_connections`` of users' at once,
    nor ``max_per_user`` of one user's: past either, the connection is answered
    ``refused`` at once, by the accepting thread, and closed. Root's are always served."""

    daemon_threads = True
    # A job's mount daemon asks for many checkpoint units at once (its read-ahead), and
    # every prolog of a node at once: the default backlog of 5 refused them (EAGAIN).
    request_queue_size = 128

    def __init__(
        self,
        path: Path,
        agent: Agent,
        max_connections: int = 64,
        max_per_user: int = 8,
        listen: socket.socket | None = None,
    ) -> None:
        """``listen``: the socket an agent restarting in place handed on (already bound
        at ``path``, its backlog holding whoever connected meanwhile)."""
        self.agent = agent
        self.max_connections = max_connections
        self.max_per_user = max_per_user
        self._open: Counter[int] = Counter()  # uid -> connections being served
        self.refused = 0  # users' connections answered busy (metrics)
        self._lock = threading.Lock()
        if listen is not None:
            super().__init__(str(path), _Handler, bind_and_activate=False)
            self.socket.close()
            self.socket = listen
            return
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        with contextlib.suppress(AgentUnavailable):
            AgentClient(path).ask(Ping(), timeout=2)
            raise AgentError(f"another agent already answers on {path}")
        path.unlink(missing_ok=True)
        super().__init__(str(path), _Handler)
        os.chmod(path, 0o666)  # users may ask about their own jobs; SO_PEERCRED decides

    def serve_forever(self, poll_interval: float = 0.1) -> None:
        """As socketserver's, looking for :meth:`shutdown` every 0.1 s (not 0.5): a
        restart in place stops accepting first, and prologs wait meanwhile."""
        super().serve_forever(poll_interval)

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            uid = peer_uid(request)
        except OSError:
            self.shutdown_request(request)
            return
        with self._lock:
            users = sum(n for u, n in self._open.items() if u != 0)
            if uid != 0 and self._open[uid] >= self.max_per_user:
                why = (
                    f"uid {uid} has {self._open[uid]} connections open, at most {self.max_per_user}"
                )
            elif uid != 0 and users >= self.max_connections:
                why = f"{users} connections of users open, at most {self.max_connections}"
            else:
                why = ""
                self._open[uid] += 1
        if why:
            self._refuse(request, why)
            return
        try:
            super().process_request(request, (uid, client_address))
        except BaseException:
            self._done(uid)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address[1])
        finally:
            self._done(client_address[0])

    def _done(self, uid: int) -> None:
        with self._lock:
            self._open[uid] -= 1
            if self._open[uid] <= 0:
                del self._open[uid]

    def _refuse(self, request: socket.socket, why: str) -> None:
        with self._lock:
            self.refused += 1
        with contextlib.suppress(OSError):
            request.send(encode(error_reply(AgentRefused(f"busy: {why}"))), socket.MSG_DONTWAIT)
        self.shutdown_request(request)

    def connections(self) -> dict[int, int]:
        """Connections being served, by uid."""
        with self._lock:
            return dict(self._open)
