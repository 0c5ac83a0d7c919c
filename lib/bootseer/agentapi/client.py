"""Talk to the node's agent: one request, one typed reply or one typed error.

The one client of the agent's socket: the prolog and epilog steps, the CLI, the pyxis
importer and a job's ``first_step`` mark all use it. Cheap to import (the standard
library and :mod:`bootseer.agentapi.protocol`): a mark from a job script is a process start.

    >>> AgentClient(Path("/run/bootseer/agent.sock")).ping()  # doctest: +SKIP
    PingReply(node='n1', pid=4242)
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bootseer import jsonlimits
from bootseer.agentapi.protocol import (
    AgentError,
    AgentRestart,
    AgentTimeout,
    AgentUnavailable,
    DepsList,
    DepsListReply,
    DepsShow,
    DepsShowReply,
    FetchPiece,
    FirstStep,
    ImageList,
    ImageListReply,
    ImageShow,
    ImageShowReply,
    JobReply,
    PieceFile,
    Ping,
    PingReply,
    Prepare,
    Release,
    ReleaseReply,
    Request,
    RestartReply,
    Stats,
    StatsReply,
    Status,
    encode,
    error_for,
)


class AgentClient:
    """The agent at ``path``; every call raises a :class:`~bootseer.agentapi.protocol.AgentError`
    subclass naming what went wrong (unavailable, timeout, refused, not found, pending...)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def send(
        self, request: Request, timeout: float | None = 10.0, fds: Sequence[int] = ()
    ) -> dict[str, Any]:
        """Send a typed request (with ``fds`` passed along, ``SCM_RIGHTS``); the reply's
        fields, or its error raised by kind. ``timeout=None`` waits as long as the agent
        works (the checkpoint door's transfers, which the agent bounds itself)."""
        return self._exchange(request.op, request.to_wire(), timeout, fds)

    def call(self, op: str, timeout: float = 10.0, **args: Any) -> dict[str, Any]:
        """Send ``{"op": op, **args}`` unchecked (the CLI's ``status``, tests)."""
        return self._exchange(op, {**args, "op": op}, timeout)

    def _exchange(
        self, op: str, doc: dict[str, Any], timeout: float | None, fds: Sequence[int] = ()
    ) -> dict[str, Any]:
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
            resp: dict[str, Any] = jsonlimits.loads(buf, max_bytes=1 << 30, what="answer")
            if not isinstance(resp, dict):
                raise ValueError(resp)
        except ValueError:
            raise AgentError(f"node agent on {self.path}: bad answer {buf[:100]!r}") from None
        if not resp.get("ok"):
            raise error_for(resp.get("kind"), f"node agent: {resp.get('error', 'request failed')}")
        return resp

    # -- typed calls ------------------------------------------------------------------

    def ping(self, timeout: float = 10.0) -> PingReply:
        return PingReply.from_wire(self.send(Ping(), timeout))

    def stats(self, timeout: float = 10.0) -> StatsReply:
        return StatsReply.from_wire(self.send(Stats(), timeout))

    def image_names(self, timeout: float = 60.0) -> ImageListReply:
        return ImageListReply.from_wire(self.send(ImageList(), timeout))

    def image_show(self, ref: str, timeout: float = 60.0) -> ImageShowReply:
        return ImageShowReply.from_wire(self.send(ImageShow(ref), timeout))

    def deps_list(self, scopes: Sequence[str], timeout: float = 60.0) -> DepsListReply:
        return DepsListReply.from_wire(self.send(DepsList(tuple(scopes)), timeout))

    def deps_show(self, scope: str, key: str, timeout: float = 60.0) -> DepsShowReply:
        return DepsShowReply.from_wire(self.send(DepsShow(scope, key), timeout))

    def prepare(self, request: Prepare, timeout: float) -> JobReply:
        return JobReply.from_wire(self.send(request, timeout))

    def status(self, job_id: int, timeout: float = 10.0) -> JobReply:
        return JobReply.from_wire(self.send(Status(job_id), timeout))

    def first_step(self, job_id: int, timeout: float = 10.0) -> JobReply:
        return JobReply.from_wire(self.send(FirstStep(job_id), timeout))

    def fetch_piece(self, request: FetchPiece, timeout: float) -> PieceFile:
        return PieceFile.from_wire(self.send(request, timeout))

    def release(self, job_id: int, timeout: float = 10.0) -> ReleaseReply:
        return ReleaseReply.from_wire(self.send(Release(job_id), timeout))

    def restart(self, when_idle: bool, timeout: float = 60.0) -> RestartReply:
        return RestartReply.from_wire(self.send(AgentRestart(when_idle), timeout))


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
