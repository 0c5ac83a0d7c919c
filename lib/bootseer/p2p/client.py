"""Asking a peer's agent for a piece, over a few persistent connections per peer.

>>> client = PeerClient(timeout=10)  # doctest: +SKIP
>>> data = client.fetch(
...     ("10.0.0.12", 746), PieceRequest(42, "", piece, PREFETCH), token
... )  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
import time
from collections import defaultdict

from bootseer.p2p.auth import prove
from bootseer.p2p.wire import (
    LIVENESS,
    Hello,
    PeerError,
    PieceReply,
    PieceRequest,
    read_message,
    recv_exact,
)

Address = tuple[str, int]


class PeerClient:
    def __init__(self, timeout: float, connect_timeout: float = 2.0, idle_per_peer: int = 4):
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.idle_per_peer = idle_per_peer
        self._idle: dict[Address, list[tuple[socket.socket, bytes]]] = defaultdict(list)
        self._lock = threading.Lock()

    def fetch(self, addr: Address, req: PieceRequest, token: bytes) -> bytes:
        """The piece's bytes (not yet verified: the caller checks the digest); PeerError
        within ``timeout`` seconds whatever the peer does. The request is proved with the
        job's ``token`` and the connection's nonce."""
        deadline = time.monotonic() + self.timeout
        sock: socket.socket | None = None
        keep = False
        try:
            sock, nonce = self._take(addr, deadline)
            proof = prove(token, nonce, req.job_id, req.piece)
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            sock.sendall(dataclasses.replace(req, proof=proof).encode())
            while True:  # heartbeats while the owner gets the piece; silence means dead
                doc = read_message(sock, min(deadline, time.monotonic() + LIVENESS))
                if doc is None:
                    raise PeerError("unreachable", f"peer {addr[0]} closed the connection")
                reply = PieceReply.decode(doc)
                if not reply.pending:
                    break
            if reply.error:
                # The server keeps the connection after a miss, not after a refusal.
                keep = reply.error not in ("refused", "protocol")
                reply.raise_error()
            data = recv_exact(sock, reply.size, deadline)  # all of it by the deadline
            assert data is not None
            keep = True
            return data
        except TimeoutError:
            raise PeerError(
                "timeout",
                f"peer {addr[0]}: no piece within {self.timeout:g}s, or silent for {LIVENESS:g}s",
            ) from None
        except OSError as exc:
            raise PeerError("unreachable", f"peer {addr[0]}:{addr[1]}: {exc}") from None
        finally:
            if sock is not None and keep:
                self._give(addr, sock, nonce)
            elif sock is not None:
                sock.close()

    def _take(self, addr: Address, deadline: float) -> tuple[socket.socket, bytes]:
        """A kept connection to ``addr``, or a new one and the nonce its server sent."""
        with self._lock:
            if self._idle[addr]:
                return self._idle[addr].pop()
        sock = socket.create_connection(addr, timeout=self.connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = read_message(sock, min(deadline, time.monotonic() + LIVENESS))
            if hello is None:
                raise PeerError("unreachable", f"peer {addr[0]} closed the connection")
            return sock, Hello.decode(hello)
        except BaseException:
            sock.close()
            raise

    def _give(self, addr: Address, sock: socket.socket, nonce: bytes) -> None:
        with self._lock:
            if len(self._idle[addr]) < self.idle_per_peer:
                self._idle[addr].append((sock, nonce))
                return
        sock.close()

    def close(self) -> None:
        with self._lock:
            for socks in self._idle.values():
                for s, _ in socks:
                    with contextlib.suppress(OSError):
                        s.close()
            self._idle.clear()
