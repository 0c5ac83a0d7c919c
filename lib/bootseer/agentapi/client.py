"""Talk to the node's agent: one request, one typed reply or one typed error.

The one client of the agent's socket: the prolog and epilog steps, the CLI, the pyxis
importer and a job's ``first_step`` mark all use it. Cheap to import (the standard
library and :mod:`bootseer.agentapi.wire`): a mark from a job script is a process start.

A client made with ``keep=N`` keeps up to N connections open between its requests and
sends its next ones on them (root's parts asking for piece after piece: the checkpoint
daemon, the prolog's restore), instead of a connection per request. The agent closes a
connection idle for some seconds: a request the agent closed its kept connection
before reading goes again on a new one; an agent of an earlier version answers one
request per connection, and the client then opens one per request as before.

    >>> AgentClient(Path("/run/bootseer/agent.sock")).ask(Ping())  # doctest: +SKIP
    PingReply(node='n1', pid=4242, started=1764000000.0, prefix='/opt/bootseer/venv')
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bootseer import jsonlimits
from bootseer.agentapi.errors import AgentError, AgentTimeout, AgentUnavailable, error_for
from bootseer.agentapi.wire import R, Request, encode
from bootseer.jsondecode import DecodeError

if TYPE_CHECKING:
    from bootseer.config import SiteConfig

DEFAULT = -1.0  # "the request's own timeout" (None means: wait as long as the agent works)
# A kept connection the agent closed sooner than this after its last reply was closed
# for having answered, not for idling: an agent that answers one request per connection.
ONE_SHOT_HINT = 2.0
# What a connection closed before any byte of its answer came raises (reset, broken pipe).
GONE = (errno.EPIPE, errno.ECONNRESET)


class _Unanswered(Exception):
    """The agent closed the connection before any byte of its answer."""


class AgentClient:
    """The agent at ``path``; every call raises a :class:`~bootseer.agentapi.errors.AgentError`
    subclass naming what went wrong (unavailable, timeout, refused, not found, pending...)."""

    def __init__(self, path: Path | str, keep: int = 0) -> None:
        """``keep``: connections kept open for the next requests (0: one per request)."""
        self.path = Path(path)
        self.keep = keep
        self.connects = 0  # connections opened (tests, benchmarks)
        self._kept: list[tuple[socket.socket, float]] = []  # idle, and since when
        self._lock = threading.Lock()
        self._one_shot = False  # the agent closes a connection once it answered
        self.one_shot_hint = ONE_SHOT_HINT

    def close(self) -> None:
        """Close the connections kept open."""
        with self._lock:
            kept, self._kept = self._kept, []
        for s, _ in kept:
            s.close()

    def ask(
        self, request: Request[R], timeout: float | None = DEFAULT, fds: Sequence[int] = ()
    ) -> R:
        """Send a typed request (with ``fds`` passed along, ``SCM_RIGHTS``) and return its
        typed reply, or raise its error by kind. ``timeout``: seconds to wait (default: the
        request's own, ``Request.timeout``); ``None`` waits as long as the agent works (the
        checkpoint door's transfers, which the agent bounds itself)."""
        return self._ask(request, timeout, fds, None)

    def ask_for_fds(
        self, request: Request[R], timeout: float | None = DEFAULT
    ) -> tuple[R, list[int]]:
        """:meth:`ask`, and the descriptors the agent sent with its reply (at most one:
        the cache's pack that holds a piece); the caller closes them."""
        got: list[int] = []
        try:
            return self._ask(request, timeout, (), got), got
        except BaseException:
            for fd in got:
                os.close(fd)
            raise

    def _ask(
        self,
        request: Request[R],
        timeout: float | None,
        fds: Sequence[int],
        got: list[int] | None,
    ) -> R:
        wait = request.timeout if timeout == DEFAULT else timeout
        doc = self._exchange(request.op, request.to_wire(), wait, fds, got)
        try:
            reply: R = request.reply.from_wire(doc)  # type: ignore[assignment]
        except DecodeError as exc:
            raise AgentError(
                f"node agent on {self.path}: bad {request.reply.__name__} reply: {exc}"
            ) from None
        return reply

    def call(self, op: str, timeout: float = 10.0, **args: object) -> dict[str, object]:
        """Send ``{"op": op, **args}`` unchecked and return the reply's fields (tests and
        diagnostics: a request the contract would not build)."""
        return self._exchange(op, {**args, "op": op}, timeout)

    def _exchange(
        self,
        op: str,
        doc: dict[str, object],
        timeout: float | None,
        fds: Sequence[int] = (),
        got: list[int] | None = None,
    ) -> dict[str, object]:
        """One request out, one answer in; with ``got``, the descriptors that came with
        the answer are added to it (else none are taken)."""
        line = encode(doc)
        while True:
            s: socket.socket | None = None
            try:
                s, since = self._connection(timeout)
                buf = _request(s, line, timeout, fds, got)
            except _Unanswered:
                if since is not None:  # a kept one, closed meanwhile: again on another
                    self._closed_kept(since)
                    continue
                raise AgentUnavailable(
                    f"node agent on {self.path}: closed the connection unanswered"
                ) from None
            except (TimeoutError, BlockingIOError):  # Blocking: the backlog stayed full
                raise AgentTimeout(
                    f"node agent on {self.path}: no answer to {op} within {timeout or 0:g}s"
                ) from None
            except OSError as exc:
                raise AgentUnavailable(f"node agent on {self.path}: {exc}") from None
            finally:
                if s is not None and sys.exc_info()[0] is not None:
                    s.close()
            self._keep(s, whole=buf.endswith(b"\n"))
            break
        try:
            resp: dict[str, object] = jsonlimits.loads(buf, max_bytes=1 << 30, what="answer")
            if not isinstance(resp, dict):
                raise ValueError(resp)
        except ValueError:
            raise AgentError(f"node agent on {self.path}: bad answer {buf[:100]!r}") from None
        if not resp.get("ok"):
            raise error_for(resp.get("kind"), f"node agent: {resp.get('error', 'request failed')}")
        return resp

    def _connection(self, timeout: float | None) -> tuple[socket.socket, float | None]:
        """A kept connection and since when it is idle, else a new one and None."""
        with self._lock:
            while self._kept:
                s, since = self._kept.pop()
                if not _closed_by_peer(s):
                    return s, since
                s.close()
                self._closed_kept(since)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            _connect(s, str(self.path), timeout)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            s.close()
            raise AgentUnavailable(f"no node agent on {self.path}: {exc.strerror}") from None
        except BaseException:
            s.close()
            raise
        with self._lock:
            self.connects += 1
        return s, None

    def _closed_kept(self, since: float) -> None:
        if time.monotonic() - since < self.one_shot_hint:
            self._one_shot = True  # an agent from before: one connection per request

    def _keep(self, s: socket.socket, whole: bool) -> None:
        """Keep ``s`` for the next request, if it may be (else close it)."""
        if whole and self.keep and not self._one_shot:
            with self._lock:
                if len(self._kept) < self.keep:
                    self._kept.append((s, time.monotonic()))
                    return
        s.close()


def _request(
    s: socket.socket,
    line: bytes,
    timeout: float | None,
    fds: Sequence[int],
    got: list[int] | None,
) -> bytes:
    """Send ``line`` (``fds`` with it) and read the answer's line; :class:`_Unanswered`
    if the connection ends before the answer's first byte."""
    s.settimeout(timeout)
    try:
        if fds:
            line = line[socket.send_fds(s, [line], list(fds)) :]
        if line:  # sendall(b"") still sends: EPIPE if the agent already answered
            s.sendall(line)
    except OSError as exc:
        if exc.errno in GONE:
            # The agent may have answered meanwhile (a refusal sent as it accepted).
            try:
                buf = _answer(s, got)
            except OSError:
                buf = b""
            if buf:
                return buf
            raise _Unanswered() from None
        raise
    try:
        buf = _answer(s, got)
    except OSError as exc:
        if exc.errno in GONE:
            raise _Unanswered() from None
        raise
    if not buf:
        raise _Unanswered()
    return buf


def _answer(s: socket.socket, got: list[int] | None) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        if got is not None and not got:
            chunk, passed, _flags, _addr = socket.recv_fds(s, 1 << 16, 1)
            got += passed
        else:
            chunk = s.recv(1 << 16)
        if not chunk:
            break
        buf += chunk
    return buf


def _closed_by_peer(s: socket.socket) -> bool:
    """An idle kept connection the agent closed (or sent something on: not ours to read)."""
    poller = select.poll()
    poller.register(s, select.POLLIN)
    return bool(poller.poll(0))


def _connect(s: socket.socket, path: str, timeout: float | None) -> None:
    """``connect(2)`` that waits for room in the agent's listen backlog, up to ``timeout``.

    A unix socket with a Python timeout is non-blocking underneath, and a non-blocking
    connect to a full backlog fails at once with EAGAIN: a user holding the backlog full
    (hundreds of idle connections) made root's prolog give up on the agent. A blocking
    connect instead sleeps in the kernel until the agent accepts, bounded by SO_SNDTIMEO
    (then EAGAIN, which :meth:`AgentClient._exchange` reports as a timeout).
    """
    s.setblocking(True)
    if timeout is not None:
        whole = max(timeout, 0.001)
        seconds = int(whole)
        tv = struct.pack("ll", seconds, int((whole - seconds) * 1e6))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
    s.connect(path)


def node_agent(cfg: SiteConfig) -> AgentClient:
    """The client of this node's agent, at the socket ``cfg``'s paths name."""
    from bootseer.nodepaths import NodePaths

    return AgentClient(NodePaths(cfg).agent_socket)
