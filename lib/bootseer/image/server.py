"""The agent's unix socket: one request per connection, the caller known by ``SO_PEERCRED``.

Each connection is one line of JSON in and one out (:mod:`bootseer.image.protocol`);
:func:`bootseer.image.handler.handle` decides what the caller may do. An error
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
from pathlib import Path
from typing import Any

from bootseer import jsonlimits
from bootseer.errors import StoreError
from bootseer.image.agent import Agent
from bootseer.image.client import AgentClient
from bootseer.image.handler import handle
from bootseer.image.protocol import (
    MAX_LINE,
    AgentBadRequest,
    AgentError,
    AgentUnavailable,
    encode,
    error_reply,
    parse_request,
)


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


class _Handler(socketserver.StreamRequestHandler):
    server: AgentServer
    # The socket is open to every user: an idle connection must not hold a thread forever.
    timeout = 10.0

    def handle(self) -> None:
        uid = peer_uid(self.request)
        line = self.rfile.readline(MAX_LINE)
        with contextlib.suppress(OSError):
            self.wfile.write(encode(self.answer(line, uid)))

    def answer(self, line: bytes, uid: int) -> dict[str, Any]:
        agent = self.server.agent
        try:
            try:
                doc = jsonlimits.loads(line, max_bytes=MAX_LINE, what="request")
            except ValueError as exc:
                raise AgentBadRequest(f"request is not one line of JSON: {exc}") from None
            return handle(agent, parse_request(doc), uid).to_wire()
        except AgentError as exc:
            return error_reply(exc)
        except (ValueError, StoreError) as exc:
            return error_reply(AgentError(str(exc)))
        except Exception as exc:
            agent.log(f"request failed: {exc!r}")
            return error_reply(AgentError(f"agent error: {exc!r}"))


class AgentServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    # A job's mount daemon asks for many checkpoint units at once (its read-ahead), and
    # every prolog of a node at once: the default backlog of 5 refused them (EAGAIN).
    request_queue_size = 128

    def __init__(self, path: Path, agent: Agent) -> None:
        self.agent = agent
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        with contextlib.suppress(AgentUnavailable):
            AgentClient(path).ping(timeout=2)
            raise AgentError(f"another agent already answers on {path}")
        path.unlink(missing_ok=True)
        super().__init__(str(path), _Handler)
        os.chmod(path, 0o666)  # users may ask about their own jobs; SO_PEERCRED decides
