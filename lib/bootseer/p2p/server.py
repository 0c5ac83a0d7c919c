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
import functools
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
from bootseer.workers import Pool

# A connection just opened may not give way to another until its asker had this long to
# send its first request (it is not idle, its request is on the way): a connection closed
# after its hello looks like a dead agent to the asker.
FRESH_GRACE = SILENCE / 2
# Requests of one connection being answered by ``provide`` at once; the next is read when
# one ends. Held pieces are sent as they are asked for, one after another.
SERVE_AT_ONCE = 64
# Threads answering requests with ``provide``, for all connections: started as first
# needed and kept (a thread started per piece cost its creation and end each time).
# Requests past them wait their turn, heartbeaten as the others are.
PROVIDERS = 256
# A heartbeat due on a connection busy sending another reply (its asker hears bytes
# then) goes this much later, in heartbeats.
BEAT_TICK = 1 / 4


@dataclass(frozen=True)
class HeldPiece:
    """A piece this node holds: ``size`` bytes at ``offset`` of a file (a cache pack),
    sent with sendfile."""

    path: Path
    size: int
    offset: int = 0


# A run's blocks (PieceRequest.blocks), in the request's order; None: not got in time.
RunBlocks = list[bytes | memoryview | None]


@dataclass(frozen=True)
class ServedJob:
    """What the server needs of one job the agent prepared."""

    addresses: frozenset[str]  # the job's nodes' addresses: only they may ask
    # (request, deadline) -> the piece's bytes, or a run's blocks (``req.blocks``);
    # PeerError("missing"/"failed") otherwise
    provide: Callable[[PieceRequest, float], bytes | memoryview | RunBlocks]
    # The fast way: the piece's file (a run's: every block's) if this node holds it and
    # it is the job's, at once (no waiting, no fetching); None sends it to ``provide``.
    held: Callable[[PieceRequest], HeldPiece | list[HeldPiece] | None] | None = None
    # Bytes a second at which this node's pieces of the job come to it (told to askers
    # with each piece: PieceReply.intake); None or 0: not known.
    intake: Callable[[], float | None] | None = None

    def intake_now(self) -> int:
        got = self.intake() if self.intake is not None else None
        return int(got or 0)


class _Link:
    """One asker's connection on the server's side: its replies are sent whole, one at a
    time (a piece's bytes never split by another reply)."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.writing = threading.Lock()
        self.answering = 0  # requests being answered by a thread of their own
        self.reading = False  # the connection's thread waits for the next request
        self._closed = False

    def send(self, *parts: bytes | memoryview) -> None:
        with self.writing:
            if self._closed:
                raise OSError("the connection was closed")
            for i, part in enumerate(parts):
                more = socket.MSG_MORE if i + 1 < len(parts) else 0
                self.conn.sendall(part, more)

    def try_send(self, part: bytes, still: Callable[[], bool]) -> bool:
        """Send ``part`` if ``still()`` holds, unless another reply is being sent (False:
        try again later; True: sent, or no longer to send)."""
        if not self.writing.acquire(blocking=False):
            return False
        try:
            if self._closed:
                raise OSError("the connection was closed")
            if still():
                self.conn.sendall(part)
            return True
        finally:
            self.writing.release()

    def shutdown(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Closed by the connection's thread only, and never while a reply is being sent
        (its descriptor could be another's by then)."""
        with self.writing:
            self._closed = True
            self.conn.close()


@dataclass(eq=False)
class _Providing:
    """A request being answered by ``provide``: the asker hears a heartbeat for it every
    ``heartbeat`` seconds until its reply (it tells a busy owner from a dead one by them)."""

    link: _Link
    req: PieceRequest
    peer: str
    deadline: float  # the asker's wait, from its request
    beat_at: float  # the next heartbeat's time


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
        heartbeat: float = HEARTBEAT,
    ) -> None:
        """``heartbeat``: how often a request being got is said to be alive, a tenth of
        the asker's silence bound (the many-node emulator stretches both with its
        scaled-down links; the product keeps wire.HEARTBEAT)."""
        self.site_key = site_key
        self.heartbeat = heartbeat
        self.lookup = lookup
        self.log = log
        self.max_connections = max_connections
        self.job_wait = job_wait
        self.serve_timeout = serve_timeout
        self.idle_timeout = idle_timeout
        self.served_bytes = 0
        self.served_pieces = 0  # a run's blocks count one each
        self.requests = 0  # requests read (a piece, or a run of blocks: one each)
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
        self._providing: set[_Providing] = set()  # requests given to the providers
        self._providers: Pool[_Providing] = Pool(PROVIDERS, self._answer_on, "peer-provide")
        self._beat = threading.Condition(self._lock)  # closing wakes the heartbeats
        self._sock = socket.create_server(address, reuse_port=False, backlog=128)
        self.port = self._sock.getsockname()[1]
        self._closed = False

    def start(self) -> None:
        threading.Thread(target=self._accept, name="peer-accept", daemon=True).start()
        threading.Thread(target=self._heartbeats, name="peer-heartbeat", daemon=True).start()

    def close(self) -> None:
        self._closed = True
        with self._beat:
            self._beat.notify_all()
        self._providers.stop()
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
                with self._lock:
                    self.requests += 1
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
                now = time.monotonic()
                work = _Providing(link, req, peer, now + self.serve_timeout, now)
                with self._slots:
                    while link.answering >= SERVE_AT_ONCE:  # the asker's next wait here
                        self._slots.wait()
                    link.answering += 1
                    work.beat_at = time.monotonic() + self.heartbeat
                    self._providing.add(work)
                    # Its first heartbeat is due after every other's (each is due within
                    # a heartbeat of now): the heartbeat thread, waiting for the earliest,
                    # needs waking only when none was due at all. Woken for every request,
                    # it was a thread switch and two passes over the waiting ones a piece.
                    if len(self._providing) == 1:
                        self._beat.notify()
                self._providers.submit(work)
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

    def _answer_on(self, work: _Providing) -> None:
        """A request answered by a provider thread (the piece comes from ``provide``),
        heartbeaten meanwhile, its reply sent whole between the connection's others."""
        link, req = work.link, work.req
        try:
            try:
                data = self._answer(req, work.peer, work.deadline)
            except PeerError as exc:
                self._provided(work)
                link.send(PieceReply(error=exc.kind, message=str(exc), tag=req.tag).encode())
                if exc.kind in ("protocol", "refused"):
                    link.shutdown()
                return
            except Exception as exc:
                self._provided(work)
                link.send(PieceReply(error="failed", message=describe(exc), tag=req.tag).encode())
                return
            job = self.lookup(req.job_id)
            intake = job.intake_now() if job is not None else 0
            if isinstance(data, list):  # a run: the blocks got, each one's length
                sizes = tuple(0 if b is None else len(b) for b in data)
                parts = [b for b in data if b]
                with self._lock:
                    self.served_bytes += sum(sizes)
                    self.served_pieces += len(parts)
                self._provided(work)
                head = PieceReply(size=sum(sizes), tag=req.tag, sizes=sizes, intake=intake)
                link.send(head.encode(), *parts)
                return
            with self._lock:
                self.served_bytes += len(data)
                self.served_pieces += 1
            self._provided(work)
            link.send(PieceReply(size=len(data), tag=req.tag, intake=intake).encode(), data)
        except OSError:
            link.shutdown()  # the connection broke: the reader ends it
        finally:
            with self._lock:
                self._providing.discard(work)
                link.answering -= 1
                if link.answering == 0 and link.reading:
                    self._idle[link.conn] = time.monotonic()
                self._slots.notify_all()

    def _provided(self, work: _Providing) -> None:
        """No heartbeat for ``work`` from now: its reply follows (a heartbeat after it
        would be for a tag its asker no longer knows)."""
        with self._lock:
            self._providing.discard(work)

    def _still(self, work: _Providing) -> bool:
        with self._lock:
            return work in self._providing

    def _heartbeats(self) -> None:
        """Every request being provided hears a heartbeat every ``heartbeat`` seconds, from
        this one thread (not a thread per request), queued ones too."""
        while not self._closed:
            now = time.monotonic()
            # Those due within a tick go now, a little early (the asker's silence bound is
            # ten heartbeats): one wake a tick for all, not one per request waiting, each
            # with two passes over all of them.
            soon = now + self.heartbeat * BEAT_TICK
            with self._lock:
                due = [w for w in self._providing if w.beat_at <= soon]
            for work in due:
                beat = PieceReply(pending=True, tag=work.req.tag).encode()
                try:
                    # Its reply is sent once it left ``_providing``, under the lock this
                    # heartbeat holds: never a heartbeat after the reply.
                    sent = work.link.try_send(beat, functools.partial(self._still, work))
                except OSError:
                    work.link.shutdown()
                    sent = True
                # Sending another reply (its asker hears bytes): again a tick later.
                work.beat_at = now + self.heartbeat * (1 if sent else BEAT_TICK)
            with self._beat:
                if self._closed:
                    return
                nxt = min((w.beat_at for w in self._providing), default=None)
                self._beat.wait(None if nxt is None else max(0.0, nxt - time.monotonic()))

    def _send_held(self, link: _Link, job: ServedJob, req: PieceRequest) -> bool:
        """Send a piece this node holds (a run's blocks, all held) straight from its files
        (``sendfile``: no copy through Python, no thread); False if it holds none
        (``provide`` answers)."""
        held = job.held(req) if job.held is not None else None
        if held is None:
            return False
        files = held if isinstance(held, list) else [held]
        fds: list[int] = []
        try:
            for h in files:
                try:
                    fds.append(os.open(h.path, os.O_RDONLY | os.O_CLOEXEC))
                except FileNotFoundError:  # evicted meanwhile
                    return False
                if os.fstat(fds[-1]).st_size < h.offset + h.size:
                    return False
            sizes = tuple(h.size for h in files)
            # Counted before it is sent, as a provided piece is: counted after, the asker
            # could hold the whole piece before the count said so.
            with self._lock:
                self.served_bytes += sum(sizes)
                self.served_pieces += len(files)
            reply = PieceReply(
                size=sum(sizes),
                tag=req.tag,
                sizes=sizes if isinstance(held, list) else (),
                intake=job.intake_now(),
            )
            with link.writing:
                link.conn.sendall(reply.encode(), socket.MSG_MORE)
                for fd, h in zip(fds, files, strict=True):
                    _sendfile(link.conn, fd, h.size, self.idle_timeout, h.offset)
        finally:
            for fd in fds:
                os.close(fd)
        return True

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

    def _answer(
        self, req: PieceRequest, peer: str, deadline: float
    ) -> bytes | memoryview | RunBlocks:
        """The piece (or a run's blocks), by ``deadline`` (the asker waits ``serve_timeout``
        from its request, the wait for the job's prolog included). Its proof was checked
        as it was read (:meth:`_known`): once a request, not twice."""
        job = self._wait_for(req.job_id, deadline)
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

    def _wait_for(self, job_id: int, by: float) -> ServedJob | None:
        """The job, waiting up to ``job_wait`` for its prolog on this node, heartbeating.

        A job's nodes start their prologs apart, and a loaded node's may come seconds
        late: the job's tasks wait for the slowest prolog anyway, so waiting for it costs
        the asker nothing, while answering "unknown" sent the asker to the store for its
        pieces (26 such drops in two loaded 16-node jobs with a 5 s wait)."""
        deadline = min(by, time.monotonic() + self.job_wait)
        with self._jobs_changed:
            while (job := self.lookup(job_id)) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._jobs_changed.wait(left)
        return job


def _sendfile(conn: socket.socket, fd: int, size: int, timeout: float, offset: int = 0) -> None:
    """``size`` bytes of ``fd`` from ``offset`` onto ``conn`` (a socket in timeout mode,
    hence non-blocking), by the kernel; OSError (the connection, mid-piece, must close)
    if the peer takes nothing for ``timeout`` seconds or the file ends early."""
    sent = 0
    poller: select.poll | None = None
    while sent < size:
        try:
            k = os.sendfile(conn.fileno(), fd, offset + sent, size - sent)
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
