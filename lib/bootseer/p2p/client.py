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
from collections.abc import Callable

from bootseer.errors import describe
from bootseer.p2p.auth import prove
from bootseer.p2p.wire import (
    SILENCE,
    Hello,
    PeerError,
    PieceReply,
    PieceRequest,
    read_message,
    recv_piece,
)

Address = tuple[str, int]


# A kept connection unused this long is closed rather than reused: the server closes idle
# connections (PeerServer.idle_timeout, 120 s) and a request on one it closed meets EOF.
REUSE_IDLE = 60.0


# Peer connections a node keeps open at most (``[p2p] max_connections``): the job's tree
# gives a node at most 2 ceil(log2 N) peers (bootseer.p2p.tree), 28 at 10,000 nodes.
MAX_OPEN = 64
# Idle connections kept per peer for the next requests: a node asks at most ceil(log2 N)
# parents (8 at 256 nodes), so 8 each fill MAX_OPEN there; with 4, the readers' bursts
# (36 pieces in flight over a few parents) closed and re-made connections all through a
# job (59 handshakes per node in a 16-node emulated job).
IDLE_PER_PEER = 8


class _Stale(Exception):
    """A kept connection the server had closed: retry on a fresh one, no fault of the peer."""


class ConnectionsFull(Exception):
    """All ``max_open`` connections stayed in use until the request's time ran out: no
    fault of the peer (the asker goes elsewhere without dropping it)."""


class PeerClient:
    def __init__(
        self,
        timeout: float,
        silence: float = SILENCE,
        idle_per_peer: int = IDLE_PER_PEER,
        max_open: int = MAX_OPEN,
    ):
        self.timeout = timeout
        # The longest a peer may say nothing at all, the connection's set-up included.
        self.silence = silence
        self.idle_per_peer = idle_per_peer
        self.max_open = max_open
        # per peer: (connection, its nonce, when it was last used)
        self._idle: dict[Address, list[tuple[socket.socket, bytes, float]]] = defaultdict(list)
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self._open = 0  # connections open (in use or idle): at most max_open
        self.connects = 0  # connections set up and authenticated (a hello read) so far
        self.most_open = 0  # the most open at once

    def fetch(
        self,
        addr: Address,
        req: PieceRequest,
        token: bytes,
        on_pending: Callable[[], None] | None = None,
    ) -> bytes:
        """The piece's bytes (not yet verified: the caller checks the digest); PeerError
        within ``timeout`` seconds whatever the peer does. The request is proved with the
        job's ``token`` and the connection's nonce. ``on_pending`` is called at each
        heartbeat: the peer is getting the piece (from the store, or once its prolog ran)."""
        deadline = time.monotonic() + self.timeout
        try:
            return self._fetch(addr, req, token, deadline, reuse=True, on_pending=on_pending)
        except _Stale:
            return self._fetch(addr, req, token, deadline, reuse=False, on_pending=on_pending)

    def _fetch(
        self,
        addr: Address,
        req: PieceRequest,
        token: bytes,
        deadline: float,
        reuse: bool,
        on_pending: Callable[[], None] | None = None,
    ) -> bytes:
        sock: socket.socket | None = None
        keep = answered = False
        try:
            sock, nonce, kept = self._take(addr, deadline, reuse)
            proof = prove(token, nonce, req.job_id, req.piece)
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            sock.sendall(dataclasses.replace(req, proof=proof).encode())
            while True:  # heartbeats while the owner gets the piece; silence means dead
                doc = read_message(sock, min(deadline, time.monotonic() + self.silence))
                if doc is None:
                    raise ConnectionResetError("the peer closed the connection")
                answered = True
                reply = PieceReply.decode(doc)
                if not reply.pending:
                    break
                if on_pending is not None:
                    on_pending()
            if reply.error:
                # The server keeps the connection after a miss, not after a refusal.
                keep = reply.error not in ("refused", "protocol")
                reply.raise_error()
            if req.length and reply.size != req.length:  # a located piece's size is known
                raise PeerError("protocol", f"{reply.size} bytes for a {req.length}-byte piece")
            data = recv_piece(sock, reply.size, deadline)  # all of it by the deadline
            keep = True
            return data
        except TimeoutError:
            raise PeerError(
                "timeout",
                f"peer {addr[0]}: no piece within {self.timeout:g}s, "
                f"or silent for {self.silence:g}s",
            ) from None
        except (OSError, PeerError) as exc:
            if sock is not None and kept and not answered:
                raise _Stale() from None
            if isinstance(exc, PeerError):
                raise
            raise PeerError("unreachable", f"peer {addr[0]}:{addr[1]}: {describe(exc)}") from None
        finally:
            if sock is not None and keep:
                self._give(addr, sock, nonce)
            elif sock is not None:
                self._close(sock)

    def _take(
        self, addr: Address, deadline: float, reuse: bool
    ) -> tuple[socket.socket, bytes, bool]:
        """A kept connection to ``addr`` (True), or a new one (False), and its nonce.
        A new one waits while ``max_open`` are open and none is idle (an idle one, of
        any peer, is closed to make room): ConnectionsFull if none frees in time."""
        now = time.monotonic()
        with self._lock:
            kept = self._idle[addr]
            while reuse and kept:
                sock, nonce, used = kept.pop()
                if now - used < REUSE_IDLE:
                    return sock, nonce, True
                self._close_locked(sock)
            while self._open >= self.max_open:
                oldest = min(
                    ((conns[0][2], a) for a, conns in self._idle.items() if conns),
                    default=None,
                )
                if oldest is not None:
                    self._close_locked(self._idle[oldest[1]].pop(0)[0])
                    continue
                left = deadline - time.monotonic()
                if left <= 0 or not self._freed.wait(left):
                    raise ConnectionsFull(f"all {self.max_open} peer connections in use")
            self._open += 1
            self.most_open = max(self.most_open, self._open)
        wait = max(0.01, min(self.silence, deadline - now))
        try:
            sock = socket.create_connection(addr, timeout=wait)
        except TimeoutError:
            self._released()
            raise PeerError("timeout", f"peer {addr[0]}: no connection within {wait:g}s") from None
        except BaseException:
            self._released()
            raise
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = read_message(sock, min(deadline, time.monotonic() + self.silence))
            if hello is None:
                raise PeerError("unreachable", f"peer {addr[0]} closed the connection")
            nonce = Hello.decode(hello)
            with self._lock:
                self.connects += 1
            return sock, nonce, False
        except BaseException:
            self._close(sock)
            raise

    def _give(self, addr: Address, sock: socket.socket, nonce: bytes) -> None:
        with self._lock:
            if len(self._idle[addr]) < self.idle_per_peer:
                self._idle[addr].append((sock, nonce, time.monotonic()))
                self._freed.notify()
                return
        self._close(sock)

    def _close(self, sock: socket.socket) -> None:
        with self._lock:
            self._close_locked(sock)

    def _close_locked(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.close()
        self._open -= 1
        self._freed.notify()

    def _released(self) -> None:
        """A connection counted but never made."""
        with self._lock:
            self._open -= 1
            self._freed.notify()

    def close(self) -> None:
        with self._lock:
            for socks in self._idle.values():
                for s, _, _ in socks:
                    self._close_locked(s)
            self._idle.clear()
