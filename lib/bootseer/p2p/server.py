"""The agent's peer server: serves a job's pieces to that job's other nodes, and no one else.

A request must prove the job's token (:mod:`.auth`) and come from an address of one of
the job's nodes; the piece must be one of the job's. An owner that does not hold the
piece yet fetches it first (``ServedJob.provide``), and so does a node that is asked
as a relay (:mod:`.tree`: it holds the piece or will). An asker keeps one connection
and sends all its requests on it, tagged: each is answered when ready (:mod:`.wire`).
Connections are capped at ``max_connections``: at the cap the idlest (nothing asked,
nothing being answered) gives way, and with none idle the next asker waits in the
listen backlog until one ends (a refusal would make it drop a live peer); an idle one
is closed after ``idle_timeout`` seconds::

    >>> server = PeerServer(("0.0.0.0", 746), site_key, jobs.get, log)  # doctest: +SKIP
    >>> server.start(); ...; server.close()  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bootseer.errors import describe
from bootseer.p2p.auth import check_proof
from bootseer.p2p.wire import (
    HEARTBEAT,
    SILENCE,
    Hello,
    PeerError,
    PieceReply,
    PieceRequest,
    read_message,
)

# A connection just opened may not give way to another until its asker had this long to
# send its first request (it is not idle, its request is on the way): a connection closed
# after its hello looks like a dead agent to the asker.
FRESH_GRACE = SILENCE / 2
# Requests of one connection answered at once by ``provide`` (each on a thread); the next
# is read when one ends. Held pieces are sent as they are asked for, one after another.
SERVE_AT_ONCE = 64


@dataclass(frozen=True)
class HeldPiece:
    """A piece this node holds: a file of exactly ``size`` bytes, sent with sendfile."""

    path: Path
    size: int


@dataclass(frozen=True)
class ServedJob:
    """What the server needs of one job the agent prepared."""

    addresses: frozenset[str]  # the job's nodes' addresses: only they may ask
    # (request, deadline) -> the piece's bytes; PeerError("missing"/"failed") otherwise
    provide: Callable[[PieceRequest, float], bytes]
    # The fast way: the piece's file if this node holds it and it is one of the job's,
    # at once (no waiting, no fetching); None sends the request to ``provide``.
    held: Callable[[PieceRequest], HeldPiece | None] | None = None


class _Link:
    """One asker's connection on the server's side: its replies are sent whole, one at a
    time (a piece's bytes never split by another reply)."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.writing = threading.Lock()
        self.answering = 0  # requests being answered by a thread of their own
        self.reading = False  # the connection's thread waits for the next request
        self._closed = False

    def send(self, *parts: bytes) -> None:
        with self.writing:
            if self._closed:
                raise OSError("the connection was closed")
            for i, part in enumerate(parts):
                more = socket.MSG_MORE if i + 1 < len(parts) else 0
                self.conn.sendall(part, more)

    def shutdown(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Closed by the connection's thread only, and never while a reply is being sent
        (its descriptor could be another's by then)."""
        with self.writing:
            self._closed = True
            self.conn.close()


class PeerServer:
    def __init__(
        self,
        address: tuple[str, int],
        site_key: bytes,
        lookup: Callable[[int], ServedJob | None],
        log: Callable[[str], None],
        max_connections: int = 64,
        job_wait: float = 20.0,
        serve_timeout: float = 30.0,
        idle_timeout: float = 120.0,
    ) -> None:
        self.site_key = site_key
        self.lookup = lookup
        self.log = log
        self.max_connections = max_connections
        self.job_wait = job_wait
        self.serve_timeout = serve_timeout
        self.idle_timeout = idle_timeout
        self.served_bytes = 0
        self.served_pieces = 0
        self.refused = 0
        self.accepted = 0  # connections accepted (each one hello, one nonce) so far
        self._active = 0
        self._idle: dict[socket.socket, float] = {}  # connections waiting for a request, since
        # Jobs a request was answered for: the first goes the slow way, under heartbeats
        # (the job's prolog may still be coming, its nodes' names are resolved then).
        self._ready: set[int] = set()
        self._jobs_changed = threading.Condition()
        self._lock = threading.Lock()
        self._slots = threading.Condition(self._lock)  # a connection ended or went idle
        self.most_active = 0  # the most connections served at once
        self._evicted: set[socket.socket] = set()  # given way, their threads still ending
        self._sock = socket.create_server(address, reuse_port=False, backlog=128)
        self.port = self._sock.getsockname()[1]
        self._closed = False

    def start(self) -> None:
        threading.Thread(target=self._accept, name="peer-accept", daemon=True).start()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def jobs_changed(self) -> None:
        """The agent prepared a job: wake requests waiting for it."""
        with self._jobs_changed:
            self._jobs_changed.notify_all()

    def _accept(self) -> None:
        while not self._closed:
            with self._slots:
                while self._active >= self.max_connections and self._idlest() is None:
                    self._slots.wait(0.5)  # a new connection's grace may end meanwhile
                    if self._closed:
                        return
            try:
                conn, addr = self._sock.accept()
            except OSError:
                return
            with self._slots:
                # Peers keep connections for their next pieces: at the cap, the one idle
                # longest gives way (its peer reconnects when it needs it), so a big job's
                # nodes are never turned away by connections nobody uses. The idle one
                # seen before the accept may have taken a request since: then this asker
                # waits for the next slot, as the ones still in the backlog do (closing
                # its connection would look like a dead peer to it).
                while True:
                    full = self._active >= self.max_connections
                    idle = self._idlest() if full else None
                    if not full or idle is not None or self._closed:
                        break
                    self._slots.wait(0.5)
                if idle is not None:
                    # It counts as closed from now: the new one takes its place.
                    del self._idle[idle]
                    self._evicted.add(idle)
                    self._active -= 1
                self._active += 1
                self.accepted += 1
                self.most_active = max(self.most_active, self._active)
            if idle is not None:
                with contextlib.suppress(OSError):
                    idle.shutdown(socket.SHUT_RDWR)
            threading.Thread(
                target=self._serve, args=(conn, addr[0]), name="peer-serve", daemon=True
            ).start()

    def _idlest(self) -> socket.socket | None:
        """The connection idle longest that may give way (caller holds the lock): not one
        just opened, whose first request is on its way (closing it would look like a dead
        peer to its asker)."""
        now = time.monotonic()
        since, conn = min(((t, c) for c, t in self._idle.items()), default=(now, None),
                          key=lambda tc: tc[0])  # fmt: skip
        return conn if since <= now else None

    def _serve(self, conn: socket.socket, peer: str) -> None:
        """One asker's connection: its requests read as they come, each answered when
        ready (a held piece at once, by this thread; one to provide by a thread of its
        own, at most ``SERVE_AT_ONCE`` at a time), replies never interleaved."""
        link = _Link(conn)
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            nonce = os.urandom(16)
            conn.settimeout(self.idle_timeout)
            conn.sendall(Hello(nonce.hex()).encode())
            grace = FRESH_GRACE  # a new connection's first request is on its way
            while True:
                with self._lock:
                    link.reading = True
                    if link.answering == 0:
                        self._idle[conn] = time.monotonic() + grace
                        self._slots.notify()
                grace = 0.0
                try:
                    if not self._readable(link):
                        return  # idle for idle_timeout
                    doc = read_message(conn)
                finally:
                    with self._lock:
                        link.reading = False
                        self._idle.pop(conn, None)
                if doc is None:
                    return
                tag = 0
                try:
                    req = PieceRequest.decode(doc)
                    tag = req.tag
                    job = self._known(req, peer, nonce)
                    if job is not None and self._send_held(link, job, req):
                        continue
                except PeerError as exc:
                    link.send(PieceReply(error=exc.kind, message=str(exc), tag=tag).encode())
                    if exc.kind in ("protocol", "refused"):
                        return
                    continue
                with self._slots:
                    while link.answering >= SERVE_AT_ONCE:  # the asker's next wait here
                        self._slots.wait()
                    link.answering += 1
                threading.Thread(
                    target=self._answer_on,
                    args=(link, req, peer, nonce),
                    name="peer-answer",
                    daemon=True,
                ).start()
        except (OSError, PeerError):
            pass
        finally:
            with self._lock:
                if conn in self._evicted:
                    self._evicted.discard(conn)
                else:
                    self._active -= 1
                self._slots.notify_all()
            link.close()

    def _readable(self, link: _Link) -> bool:
        """Wait for the asker's next request: False once the connection was idle (nothing
        asked, nothing being answered) for ``idle_timeout`` seconds."""
        poller = select.poll()
        poller.register(link.conn.fileno(), select.POLLIN)
        idle_since = time.monotonic()
        while not poller.poll(self.idle_timeout * 1000 / 4):
            with self._lock:
                if link.answering:
                    idle_since = time.monotonic()
            if time.monotonic() - idle_since >= self.idle_timeout:
                return False
        return True

    def _answer_on(self, link: _Link, req: PieceRequest, peer: str, nonce: bytes) -> None:
        """A request answered on its own thread (the piece comes from ``provide``), its
        reply sent whole between the connection's others."""
        try:
            try:
                data = self._answer_beating(link, req, peer, nonce)
            except PeerError as exc:
                link.send(PieceReply(error=exc.kind, message=str(exc), tag=req.tag).encode())
                if exc.kind in ("protocol", "refused"):
                    link.shutdown()
                return
            with self._lock:
                self.served_bytes += len(data)
                self.served_pieces += 1
            link.send(PieceReply(size=len(data), tag=req.tag).encode(), data)
        except OSError:
            link.shutdown()  # the connection broke: the reader ends it
        finally:
            with self._lock:
                link.answering -= 1
                if link.answering == 0 and link.reading:
                    self._idle[link.conn] = time.monotonic()
                self._slots.notify_all()

    def _send_held(self, link: _Link, job: ServedJob, req: PieceRequest) -> bool:
        """Send a piece this node holds straight from its file (``sendfile``: no copy
        through Python, no thread); False if it holds none (``provide`` answers)."""
        held = job.held(req) if job.held is not None else None
        if held is None:
            return False
        try:
            fd = os.open(held.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # evicted meanwhile
            return False
        try:
            if os.fstat(fd).st_size != held.size:
                return False
            # Counted before it is sent, as a provided piece is: counted after, the asker
            # could hold the whole piece before the count said so.
            with self._lock:
                self.served_bytes += held.size
                self.served_pieces += 1
            with link.writing:
                link.conn.sendall(PieceReply(size=held.size, tag=req.tag).encode(), socket.MSG_MORE)
                _sendfile(link.conn, fd, held.size, self.idle_timeout)
        finally:
            os.close(fd)
        return True

    def _answer_beating(self, link: _Link, req: PieceRequest, peer: str, nonce: bytes) -> bytes:
        """The answer, with a heartbeat every HEARTBEAT seconds while it takes: the asker
        tells a busy owner (waiting on the store) from a dead one by it."""
        done = threading.Event()
        result: list[bytes] = []
        failure: list[BaseException] = []

        def work() -> None:
            try:
                result.append(self._answer(req, peer, nonce))
            except BaseException as exc:
                failure.append(exc)
            finally:
                done.set()

        threading.Thread(target=work, name="peer-provide", daemon=True).start()
        while not done.wait(HEARTBEAT):
            link.send(PieceReply(pending=True, tag=req.tag).encode())
        if failure:
            exc = failure[0]
            raise exc if isinstance(exc, PeerError) else PeerError("failed", describe(exc))
        return result[0]

    def _known(self, req: PieceRequest, peer: str, nonce: bytes) -> ServedJob | None:
        """The job, if prepared here and asked for before, that the request proves it is
        of and the peer is a node of; None if not (``_answer`` then waits for it, under
        heartbeats); PeerError("refused") otherwise."""
        if not check_proof(self.site_key, nonce, req.job_id, req.piece, req.proof):
            self._refuse(f"peer {peer}: bad proof for job {req.job_id}")
        if req.job_id not in self._ready:
            return None
        job = self.lookup(req.job_id)
        if job is not None and peer not in job.addresses:
            self._refuse(f"peer {peer}: not a node of job {req.job_id}")
        return job

    def _answer(self, req: PieceRequest, peer: str, nonce: bytes) -> bytes:
        # The asker waits this long from its request, the wait for the job's prolog included.
        deadline = time.monotonic() + self.serve_timeout
        if not check_proof(self.site_key, nonce, req.job_id, req.piece, req.proof):
            self._refuse(f"peer {peer}: bad proof for job {req.job_id}")
        job = self._wait_for(req.job_id)
        if job is None:
            raise PeerError("unknown", f"job {req.job_id} is not prepared here")
        if peer not in job.addresses:
            self._refuse(f"peer {peer}: not a node of job {req.job_id}")
        with self._lock:
            if len(self._ready) >= 100_000:  # an agent up for very many jobs
                self._ready.clear()
            self._ready.add(req.job_id)
        return job.provide(req, deadline)

    def _refuse(self, why: str) -> None:
        with self._lock:
            self.refused += 1
        self.log(f"p2p: refused {why}")
        raise PeerError("refused", "refused")  # the asker learns nothing more

    def _wait_for(self, job_id: int) -> ServedJob | None:
        """The job, waiting up to ``job_wait`` for its prolog on this node, heartbeating.

        A job's nodes start their prologs apart, and a loaded node's may come seconds
        late: the job's tasks wait for the slowest prolog anyway, so waiting for it costs
        the asker nothing, while answering "unknown" sent the asker to the store for its
        pieces (26 such drops in two loaded 16-node jobs with a 5 s wait)."""
        deadline = time.monotonic() + self.job_wait
        with self._jobs_changed:
            while (job := self.lookup(job_id)) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._jobs_changed.wait(left)
        return job


def _sendfile(conn: socket.socket, fd: int, size: int, timeout: float) -> None:
    """``size`` bytes of ``fd`` from its start onto ``conn`` (a socket in timeout mode,
    hence non-blocking), by the kernel; OSError (the connection, mid-piece, must close)
    if the peer takes nothing for ``timeout`` seconds or the file ends early."""
    sent = 0
    poller: select.poll | None = None
    while sent < size:
        try:
            k = os.sendfile(conn.fileno(), fd, sent, size - sent)
        except BlockingIOError:
            if poller is None:
                poller = select.poll()
                poller.register(conn.fileno(), select.POLLOUT)
            if not poller.poll(timeout * 1000):
                raise TimeoutError(f"the peer took {sent} of {size} bytes") from None
            continue
        if k == 0:
            raise OSError(f"the piece's file ended after {sent} of {size} bytes")
        sent += k
