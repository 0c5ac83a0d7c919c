"""Talk to the node's agent: one request, one typed reply or one typed error.

The one client of the agent's socket: the prolog and epilog steps, the CLI, the pyxis
importer and a job's ``first_step`` mark all use it. Cheap to import (the standard
library and :mod:`bootseer.agentapi.wire`): a mark from a job script is a process start.

    >>> AgentClient(Path("/run/bootseer/agent.sock")).ask(Ping())  # doctest: +SKIP
    PingReply(node='n1', pid=4242, started=1764000000.0, prefix='/opt/bootseer/venv')
"""

from __future__ import annotations

import os
import socket
import struct
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


class AgentClient:
    """The agent at ``path``; every call raises a :class:`~bootseer.agentapi.errors.AgentError`
    subclass naming what went wrong (unavailable, timeout, refused, not found, pending...)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

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
        """:meth:`ask`, and the descriptors the agent sent with its reply (at most one: a
        piece's cache file); the caller closes them."""
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
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            try:
                _connect(s, str(self.path), timeout)
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                raise AgentUnavailable(f"no node agent on {self.path}: {exc.strerror}") from None
            s.settimeout(timeout)
            line = encode(doc)
            if fds:
                line = line[socket.send_fds(s, [line], list(fds)) :]
            if line:  # sendall(b"") still sends: EPIPE if the agent already answered
                s.sendall(line)
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
        except (TimeoutError, BlockingIOError):  # BlockingIOError: the backlog stayed full
            raise AgentTimeout(
                f"node agent on {self.path}: no answer to {op} within {timeout or 0:g}s"
            ) from None
        except OSError as exc:
            raise AgentUnavailable(f"node agent on {self.path}: {exc}") from None
        finally:
            s.close()
        try:
            resp: dict[str, object] = jsonlimits.loads(buf, max_bytes=1 << 30, what="answer")
            if not isinstance(resp, dict):
                raise ValueError(resp)
        except ValueError:
            raise AgentError(f"node agent on {self.path}: bad answer {buf[:100]!r}") from None
        if not resp.get("ok"):
            raise error_for(resp.get("kind"), f"node agent: {resp.get('error', 'request failed')}")
        return resp


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
