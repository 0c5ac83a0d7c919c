"""Asking a peer's agent for pieces: one connection per peer, kept, carrying them all.

A node asks a peer for many pieces at once (its readers' windows): the requests go out
on one authenticated connection, each with a tag, and a thread per connection reads the
replies as they come and hands each to its asker. The connection is set up (TCP, the
server's hello and its nonce) once per peer and kept for the job, so a node makes about
one handshake per peer it asks, not one per piece or per burst::

>>> client = PeerClient(timeout=10)  # doctest: +SKIP
>>> data = client.fetch(
...     ("10.0.0.12", 746), PieceRequest(42, "", piece, PREFETCH), token
... )  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import itertools
import select
import socket
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from bootseer.directio import Buffers
from bootseer.errors import describe
from bootseer.p2p.auth import prove
from bootseer.p2p.wire import (
    SILENCE,
    Hello,
    PeerError,
    PieceReply,
    PieceRequest,
    read_message,
    recv_into_alive,
    recv_piece_alive,
)

Address = tuple[str, int]
# Told of a piece's bytes, once all came: how many, the seconds from its reply's header
# to its last byte (the data phase), and the peer's own intake (PieceReply.intake):
# bootseer.p2p.linkrate.
Received = Callable[[int, float, int], None]


# A kept connection unused this long is closed rather than reused: the server closes idle
# connections (PeerServer.idle_timeout, 120 s) and a request on one it closed meets EOF.
REUSE_IDLE = 60.0


# Peer connections a node keeps open at most (``[p2p] max_connections``): one per peer,
# and the job's tree gives a node at most 2 ceil(log2 N) peers (bootseer.p2p.tree), 28 at
# 10,000 nodes.
MAX_OPEN = 64


# Run buffers kept for the next runs (each up to a run's size, ``prefetch_run_kib``):
# as many as the fetch workers (``prefetch_parallel``) hold at once, a run each.
RUN_BUFFERS = 16


class _Stale(Exception):
    """A kept connection the server had closed: retry on a fresh one, no fault of the peer."""


class ConnectionsFull(Exception):
    """All ``max_open`` connections stayed in use until the request's time ran out: no
    fault of the peer (the asker goes elsewhere without dropping it)."""


def _fresh(exc: PeerError) -> PeerError:
    return PeerError(exc.kind, str(exc))


class _Call:
    """One request on a connection, until its answer (bytes or a PeerError) comes."""

    def __init__(
        self,
        tag: int,
        length: int,
        on_pending: Callable[[], None] | None = None,
        run: bool = False,
        on_received: Received | None = None,
    ) -> None:
        self.tag = tag
        self.length = length  # the piece's size when the request says it (0: any)
        self.run = run  # a run was asked (PieceRequest.blocks): its bytes go to a buffer
        self.on_pending = on_pending  # told of each heartbeat (the asker's hedging)
        self.on_received = on_received  # told how long the bytes took (the asker's rates)
        self.done = threading.Event()
        self.data: bytes | memoryview | None = None
        self.sizes: tuple[int, ...] = ()  # a run's reply: each block's length in ``data``
        self.error: BaseException | None = None
        self.answered = False  # the peer said something about it (a heartbeat counts)
        self.pending = False  # the last it said was a heartbeat: it is getting the piece
        self.abandoned = False  # its asker gave up: its reply is read and dropped


class _Link:
    """One authenticated connection to a peer, and the thread that reads its replies."""

    def __init__(
        self,
        addr: Address,
        sock: socket.socket,
        nonce: bytes,
        silence: float,
        idle: Callable[[], None],
        buffers: Buffers,
    ) -> None:
        self.addr = addr
        self.buffers = buffers  # the client's, for runs received
        self.idle = idle  # called when its last open call ends: it may give way now
        self.sock = sock
        self.nonce = nonce
        self.silence = silence
        self.writing = threading.Lock()
        self.lock = threading.Lock()
        self.calls: OrderedDict[int, _Call] = OrderedDict()  # in the order they were sent
        self.tags = itertools.count(1)
        self.receiving: _Call | None = None  # the call whose piece is arriving
        self.alive_at = time.monotonic()  # last heard from, or since when a call waits
        self.used_at = time.monotonic()
        self.dead: PeerError | None = None
        self.closed = False
        self.counted = True  # among the client's open connections

    def busy(self) -> bool:
        with self.lock:
            return bool(self.calls)

    def send(
        self,
        req: PieceRequest,
        token: bytes,
        on_pending: Callable[[], None] | None = None,
        on_received: Received | None = None,
    ) -> _Call:
        with self.lock:
            if self.dead is not None:
                raise _fresh(self.dead)
            call = _Call(
                next(self.tags),
                req.length,
                on_pending,
                run=bool(req.blocks),
                on_received=on_received,
            )
            if not self.calls:
                self.alive_at = time.monotonic()  # the wait for an answer starts now
            self.calls[call.tag] = call
            self.used_at = time.monotonic()
        proof = prove(token, self.nonce, req.job_id, req.piece)
        frame = req.frame(proof, call.tag)
        try:
            with self.writing:
                if self.closed:
                    raise ConnectionResetError("the connection was closed")
                self.sock.sendall(frame)
        except OSError as exc:
            self.fail(PeerError("unreachable", f"peer {self.addr[0]}: {describe(exc)}"))
        return call

    def silent_for(self) -> float:
        """Seconds the peer has said nothing while a call waited (0 while a piece arrives)."""
        with self.lock:
            if self.receiving is not None or not self.calls:
                return 0.0
            return time.monotonic() - self.alive_at

    def abandon(self, call: _Call) -> None:
        """Its asker gave up (its deadline passed): a piece still arriving for it ends the
        connection (a peer that trickles), one not started is dropped when it comes."""
        with self.lock:
            call.abandoned = True
            trickling = self.receiving is call
        if trickling:
            self.shutdown()

    def read_replies(self) -> None:
        """The connection's reader: every reply to its call, until the connection ends."""
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        try:
            while True:
                poller.poll()  # a reply, the peer's close, or our own shutdown
                doc = read_message(self.sock)
                if doc is None:
                    raise ConnectionResetError("the peer closed the connection")
                reply = PieceReply.decode(doc)
                with self.lock:
                    self.alive_at = time.monotonic()
                    call = self._call_of(reply.tag)
                    call.answered = True
                    call.pending = reply.pending
                    if reply.size and not reply.error and not reply.pending:
                        if call.length and reply.size != call.length:
                            raise PeerError(
                                "protocol", f"{reply.size} bytes for a {call.length}-byte piece"
                            )
                        self.receiving = call
                if reply.pending:
                    if call.on_pending is not None:
                        call.on_pending()
                    continue
                if reply.error:
                    try:
                        reply.raise_error()
                    except PeerError as exc:
                        self._finish(call, error=exc)
                    continue
                data: bytes | memoryview
                started = time.monotonic()
                if call.run and reply.sizes:
                    # A run: into a page-aligned buffer used again once its blocks are
                    # written and let go (the cache writes them from there: no copy).
                    buf = self.buffers.get(reply.size)
                    data = memoryview(buf)[: reply.size]
                    self.buffers.retire(data)
                    del buf
                    recv_into_alive(self.sock, data, self.silence)
                else:
                    data = recv_piece_alive(self.sock, reply.size, self.silence)
                with self.lock:
                    self.receiving = None
                    self.alive_at = time.monotonic()
                if call.on_received is not None:
                    call.on_received(len(data), self.alive_at - started, reply.intake)
                call.sizes = reply.sizes
                self._finish(call, data=data)
                # Not held while the next reply is awaited: a run's buffer is used again
                # only once no view of it is left.
                del call, data
        except TimeoutError:
            self.fail(PeerError("timeout", f"peer {self.addr[0]}: silent for {self.silence:g}s"))
        except PeerError as exc:
            self.fail(exc)
        except OSError as exc:
            self.fail(PeerError("unreachable", f"peer {self.addr[0]}: {describe(exc)}"))
        finally:
            with self.writing:  # no sender holds the descriptor: it cannot be another's
                self.closed = True
                self.sock.close()

    def _call_of(self, tag: int) -> _Call:
        if tag == 0 and self.calls:  # a peer of old answers in order
            return next(iter(self.calls.values()))
        call = self.calls.get(tag)
        if call is None:
            raise PeerError("protocol", f"a reply to no request (tag {tag})")
        return call

    def _finish(
        self,
        call: _Call,
        data: bytes | memoryview | None = None,
        error: BaseException | None = None,
    ) -> None:
        with self.lock:
            self.calls.pop(call.tag, None)
            self.used_at = time.monotonic()
            idle = not self.calls
        call.data, call.error = data, error
        call.done.set()
        if idle:
            self.idle()

    def fail(self, exc: PeerError) -> None:
        """The connection is done for: every call still open gets ``exc`` (a copy each:
        their askers raise it in threads of their own)."""
        with self.lock:
            if self.dead is None:
                self.dead = exc
            calls = list(self.calls.values())
            self.calls.clear()
        for call in calls:
            call.error = _fresh(exc)
            call.done.set()
        self.shutdown()

    def shutdown(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


class PeerClient:
    def __init__(
        self,
        timeout: float,
        silence: float = SILENCE,
        max_open: int = MAX_OPEN,
    ):
        self.timeout = timeout
        # The longest a peer may say nothing at all, the connection's set-up included.
        self.silence = silence
        self.max_open = max_open
        self._links: dict[Address, _Link] = {}
        self._connecting: set[Address] = set()
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self._open = 0  # connections open or being set up: at most max_open
        self.closed = False  # close() was called: its requests failed, no peer's fault
        self.connects = 0  # connections set up and authenticated (a hello read) so far
        self.most_open = 0  # the most open at once
        # Runs are received into these (page-aligned, used again once nothing holds a
        # view of them: a fresh buffer's pages cost the kernel more than the copy).
        self.buffers = Buffers(keep=RUN_BUFFERS)

    def fetch(
        self,
        addr: Address,
        req: PieceRequest,
        token: bytes,
        on_pending: Callable[[], None] | None = None,
        on_received: Received | None = None,
    ) -> bytes:
        """The piece's bytes (not yet verified: the caller checks the digest); PeerError
        within ``timeout`` seconds whatever the peer does. The request is proved with the
        job's ``token`` and the connection's nonce. ``on_pending`` is called at each
        heartbeat: the peer is getting the piece (from the store, or once its prolog ran);
        ``on_received`` when its bytes have all come, with how long they took."""
        data = self._call(addr, req, token, on_pending, on_received).data
        return bytes(data or b"")  # (bytes as received: a buffer is a run's alone)

    def fetch_run(
        self,
        addr: Address,
        req: PieceRequest,
        token: bytes,
        on_pending: Callable[[], None] | None = None,
        on_received: Received | None = None,
    ) -> tuple[bytes | memoryview, tuple[int, ...]]:
        """A run's reply (``req.blocks``): its bytes and each block's length in them (not
        yet verified, nor checked against the run: the caller does both). A server that
        answered with no ``sizes`` (an older version) gives ``()``. The bytes are a view
        of a page-aligned buffer of the client's, taken again once no view of it is left."""
        call = self._call(addr, req, token, on_pending, on_received)
        return call.data or b"", call.sizes

    def _call(
        self,
        addr: Address,
        req: PieceRequest,
        token: bytes,
        on_pending: Callable[[], None] | None,
        on_received: Received | None = None,
    ) -> _Call:
        deadline = time.monotonic() + self.timeout
        try:
            return self._fetch(addr, req, token, deadline, None, on_pending, on_received)
        except _Stale as stale:
            link = stale.args[0]
            return self._fetch(addr, req, token, deadline, link, on_pending, on_received)

    def _fetch(
        self,
        addr: Address,
        req: PieceRequest,
        token: bytes,
        deadline: float,
        stale: _Link | None,
        on_pending: Callable[[], None] | None = None,
        on_received: Received | None = None,
    ) -> _Call:
        link, kept = self._link(addr, deadline, stale)
        try:
            call = link.send(req, token, on_pending, on_received)
        except PeerError:
            if kept and stale is None:  # it died since it was taken: try a fresh one
                raise _Stale(link) from None
            raise
        while not call.done.wait(self._wait(link, deadline)):
            if time.monotonic() >= deadline:
                link.abandon(call)
                if call.pending:
                    # It heartbeated to the end: alive, still getting the piece itself (its
                    # own source is slow: a relay's parent, the store under load). Busy is
                    # not dead: the asker goes elsewhere for this piece, keeps the peer.
                    raise PeerError(
                        "late", f"peer {addr[0]}: still getting the piece after {self.timeout:g}s"
                    )
                raise PeerError(
                    "timeout",
                    f"peer {addr[0]}: no piece within {self.timeout:g}s, "
                    f"or silent for {self.silence:g}s",
                )
            if link.silent_for() >= self.silence:
                link.fail(PeerError("timeout", f"peer {addr[0]}: silent for {self.silence:g}s"))
        if call.error is not None:
            if kept and not call.answered and stale is None:
                raise _Stale(link)  # the server had closed it: try a fresh one
            raise call.error
        assert call.data is not None
        return call

    def _wait(self, link: _Link, deadline: float) -> float:
        left = deadline - time.monotonic()
        quiet = self.silence - link.silent_for()
        return max(0.01, min(left, quiet))

    def _link(self, addr: Address, deadline: float, stale: _Link | None) -> tuple[_Link, bool]:
        """The connection to ``addr``, kept (True) or new (False). A new one waits while
        ``max_open`` are open and none is idle (an idle one, of any peer, is closed to make
        room): ConnectionsFull if none frees in time."""
        with self._lock:
            while True:
                link = self._links.get(addr)
                now = time.monotonic()
                if link is not None:
                    if (
                        link is not stale
                        and link.dead is None
                        and (link.busy() or now - link.used_at < REUSE_IDLE)
                    ):
                        return link, True
                    self._forget_locked(link)
                    link.shutdown()
                    continue
                if addr in self._connecting:  # another asker is setting it up: share it
                    if not self._freed.wait(max(0.0, deadline - now)):
                        raise ConnectionsFull(f"no connection to {addr[0]} in time")
                    continue
                if self._open >= self.max_open:
                    idle = [x for x in self._links.values() if not x.busy()]
                    if idle:
                        oldest = min(idle, key=lambda x: x.used_at)
                        self._forget_locked(oldest)
                        oldest.shutdown()
                        continue
                    if not self._freed.wait(max(0.0, deadline - now)):
                        raise ConnectionsFull(f"all {self.max_open} peer connections in use")
                    continue
                self._open += 1
                self.most_open = max(self.most_open, self._open)
                self._connecting.add(addr)
                break
        link = None
        try:
            sock, nonce = self._connect(addr, deadline)
            link = _Link(addr, sock, nonce, self.silence, self._went_idle, self.buffers)
            threading.Thread(
                target=self._read, args=(link,), name="peer-replies", daemon=True
            ).start()
            return link, False
        finally:
            with self._lock:
                self._connecting.discard(addr)
                if link is None:
                    self._open -= 1
                else:
                    self._links[addr] = link
                    self.connects += 1
                self._freed.notify_all()

    def _connect(self, addr: Address, deadline: float) -> tuple[socket.socket, bytes]:
        wait = max(0.01, min(self.silence, deadline - time.monotonic()))
        try:
            sock = socket.create_connection(addr, timeout=wait)
        except TimeoutError:
            raise PeerError("timeout", f"peer {addr[0]}: no connection within {wait:g}s") from None
        except OSError as exc:
            raise PeerError("unreachable", f"peer {addr[0]}:{addr[1]}: {describe(exc)}") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = read_message(sock, min(deadline, time.monotonic() + self.silence))
            if hello is None:
                raise PeerError("unreachable", f"peer {addr[0]} closed the connection")
            nonce = Hello.decode(hello)
            # From here the reader thread reads in blocking mode; a send the peer does
            # not take for ``silence`` seconds fails (the peer is hung).
            sock.settimeout(None)
            sec = int(self.silence)
            tv = struct.pack("ll", sec, int((self.silence - sec) * 1e6))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
            return sock, nonce
        except TimeoutError:
            sock.close()
            raise PeerError(
                "timeout", f"peer {addr[0]}: no hello within {self.silence:g}s"
            ) from None
        except OSError as exc:
            sock.close()
            raise PeerError("unreachable", f"peer {addr[0]}:{addr[1]}: {describe(exc)}") from None
        except BaseException:
            sock.close()
            raise

    def _went_idle(self) -> None:
        """A connection has nothing in flight: an asker waiting at ``max_open`` may close it."""
        with self._lock:
            self._freed.notify_all()

    def _read(self, link: _Link) -> None:
        try:
            link.read_replies()
        finally:
            with self._lock:
                self._forget_locked(link)

    def _forget_locked(self, link: _Link) -> None:
        """The connection no longer counts (caller holds the lock); its reader ends it."""
        if self._links.get(link.addr) is link:
            del self._links[link.addr]
        if link.counted:
            link.counted = False
            self._open -= 1
            self._freed.notify_all()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            links = list(self._links.values())
            for link in links:
                self._forget_locked(link)
        for link in links:
            link.fail(PeerError("unreachable", "the client was closed"))
