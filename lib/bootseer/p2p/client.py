"""Asking a peer's agent for a piece, over a few persistent connections per peer.

>>> client = PeerClient(timeout=10)  # doctest: +SKIP
>>> data = client.fetch(
...     ("10.0.0.12", 7461), PieceRequest(42, token, piece, PREFETCH)
... )  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import defaultdict

from bootseer.p2p.wire import PeerError, PieceReply, PieceRequest, read_message, recv_exact

Address = tuple[str, int]


class PeerClient:
    def __init__(self, timeout: float, connect_timeout: float = 2.0, idle_per_peer: int = 4):
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.idle_per_peer = idle_per_peer
        self._idle: dict[Address, list[socket.socket]] = defaultdict(list)
        self._lock = threading.Lock()

    def fetch(self, addr: Address, req: PieceRequest) -> bytes:
        """The piece's bytes (not yet verified: the caller checks the digest); PeerError
        within ``timeout`` seconds whatever the peer does."""
        deadline = time.monotonic() + self.timeout
        sock = self._take(addr)
        keep = False
        try:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            sock.sendall(req.encode())
            doc = read_message(sock, deadline)
            if doc is None:
                raise PeerError("unreachable", f"peer {addr[0]} closed the connection")
            reply = PieceReply.decode(doc)
            if reply.error:
                # The server keeps the connection after a miss, not after a refusal.
                keep = reply.error not in ("refused", "protocol")
                reply.raise_error()
            data = recv_exact(sock, reply.size, deadline)
            assert data is not None
            keep = True
            return data
        except TimeoutError:
            raise PeerError(
                "timeout", f"peer {addr[0]}: no piece within {self.timeout:g}s"
            ) from None
        except OSError as exc:
            raise PeerError("unreachable", f"peer {addr[0]}:{addr[1]}: {exc}") from None
        finally:
            if keep:
                self._give(addr, sock)
            else:
                sock.close()

    def _take(self, addr: Address) -> socket.socket:
        with self._lock:
            if self._idle[addr]:
                return self._idle[addr].pop()
        try:
            sock = socket.create_connection(addr, timeout=self.connect_timeout)
        except OSError as exc:
            raise PeerError("unreachable", f"peer {addr[0]}:{addr[1]}: {exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _give(self, addr: Address, sock: socket.socket) -> None:
        with self._lock:
            if len(self._idle[addr]) < self.idle_per_peer:
                self._idle[addr].append(sock)
                return
        sock.close()

    def close(self) -> None:
        with self._lock:
            for socks in self._idle.values():
                for s in socks:
                    with contextlib.suppress(OSError):
                        s.close()
            self._idle.clear()
