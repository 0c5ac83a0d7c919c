"""The peer protocol: one typed request and reply, framed, on a persistent TCP connection.

Each message is a 4-byte big-endian length and a JSON object; a reply that carries a
piece is followed by exactly ``size`` bytes. A connection carries many requests at once:
each has a ``tag`` its replies (heartbeats included) repeat, and replies come in the
order they are ready, a piece's bytes never split; a reply without a tag (a peer of an
older version, which answers one request at a time) answers the oldest request open.

A request may name a *run*: several blocks of the job's image by their indices
(``blocks``), its ``piece`` the :func:`run_digest` of their digests. Its reply carries
the blocks one after another, ``sizes`` saying each one's length (0: not sent, the
server could not get it); the asker checks every block by its own digest. A server of
an older version ignores ``blocks`` and answers "missing" (no block has the run's
digest): the asker then asks block by block::

    >>> frame = PieceRequest(42, "ab" * 32, "cd" * 32, 1).encode()
    >>> int.from_bytes(frame[:4], "big") == len(frame) - 4
    True
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import struct
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

from bootseer import digest as digests
from bootseer import jsonlimits
from bootseer.choices import one_of
from bootseer.errors import BootseerError
from bootseer.image.blocks import MAX_RUN_BLOCKS

MAX_HEADER = 4096  # no request or reply header is longer; a longer one ends the connection
MAX_PIECE = 64 << 20
# Blocks one run may name (its indices fit a request's header).
MAX_RUN = MAX_RUN_BLOCKS
# A server still getting a piece (its owner reads the store for it) says so this often.
HEARTBEAT = 1.0
# An asker that hears nothing at all from a peer this long (no hello, no heartbeat, no
# byte of the piece) drops it as dead or hung: ``[p2p] peer_silence``. Busy is not dead:
# on this 2-core machine at load 8, with the serving agent's own threads hashing and
# spinning, the longest gap between heartbeats was 1.25 s; TCP retries a lost SYN after
# 1 s and 3 s. A dead agent costs nothing (refused, reset); only a hung one costs this.
SILENCE = 10.0


# refused: not authenticated for the job; unknown: the job is not (yet) on that node;
# missing: not a piece of the job; failed: the owner could not fetch it; protocol: bad bytes;
# timeout: silent for the silence bound, or its bytes too slow for the piece's; late: still
# getting the piece itself (heartbeating) when the piece's bound passed
PeerErrorKind = Literal[
    "refused", "unknown", "missing", "failed", "protocol", "unreachable", "timeout", "late"
]
KINDS: tuple[PeerErrorKind, ...] = get_args(PeerErrorKind)


class PeerError(BootseerError):
    """A peer could not serve a piece; ``kind`` says why (one of :data:`KINDS`)."""

    def __init__(self, kind: PeerErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class PieceRequest:
    job_id: int
    proof: str  # hex HMAC of the connection's nonce and this request (auth.prove)
    piece: str  # the piece's digest (bootseer.digest), or a run's run_digest
    priority: int  # the fetch priority the asking node needs it at (fetch.DEMAND ...)
    # Where the piece is in the store, for pieces outside an image's manifest (a
    # snapshot's frames): a byte range of one object. Empty for image blocks.
    key: str = ""
    offset: int = 0
    length: int = 0
    target: str = ""  # the store the key is in: a checkpoint target's URI, "" the main store
    cached_only: bool = False  # answer only from what the peer holds (the store failed)
    tag: int = 0  # the request's number on its connection, repeated by its replies
    # A run: indices of blocks of the job's image, ``piece`` their run_digest; () a piece.
    blocks: tuple[int, ...] = ()
    # The rule the asker found its image blocks' trees by (bootseer.p2p.owner.TREES);
    # "": an older version's (by digest), or a piece outside an image.
    trees: str = ""

    def encode(self) -> bytes:
        return self.frame(self.proof, self.tag)

    def frame(self, proof: str, tag: int) -> bytes:
        """The request framed with this ``proof`` and ``tag`` (the connection's), the
        fields by hand in their declared order: ``dataclasses.asdict`` deep-copies every
        field and was, with ``replace``, a sixth of an asking node's CPU per piece."""
        doc: dict[str, object] = {
            "job_id": self.job_id,
            "proof": proof,
            "piece": self.piece,
            "priority": self.priority,
            "key": self.key,
            "offset": self.offset,
            "length": self.length,
            "target": self.target,
            "cached_only": self.cached_only,
            "tag": tag,
        }
        if self.blocks:  # a piece's request is sent as an older version sends it
            doc["blocks"] = list(self.blocks)
        if self.trees:
            doc["trees"] = self.trees
        return _frame(doc)

    @classmethod
    def decode(cls, doc: Any) -> PieceRequest:
        try:
            blocks = doc.get("blocks", [])
            if not isinstance(blocks, list) or len(blocks) > MAX_RUN:
                raise ValueError("blocks")
            req = cls(
                int(doc["job_id"]),
                str(doc["proof"]),
                str(doc["piece"]),
                int(doc["priority"]),
                str(doc.get("key", "")),
                int(doc.get("offset", 0)),
                int(doc.get("length", 0)),
                str(doc.get("target", "")),
                doc.get("cached_only", False) is True,
                int(doc.get("tag", 0)),
                tuple(_index(b) for b in blocks),
                str(doc.get("trees", "")),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            raise PeerError("protocol", "malformed piece request") from None
        if (
            not digests.valid(req.piece)
            or len(req.proof) != 64
            or not 0 < req.job_id < 2**40
            or len(req.key) > 1024
            or len(req.target) > 1024
            or len(req.trees) > 64
            or req.offset < 0
            or not 0 <= req.length <= MAX_PIECE
            or not 0 <= req.tag < 2**31
            or (req.blocks and (req.key or req.target or req.length or req.cached_only))
        ):
            raise PeerError("protocol", "malformed piece request")
        return req


@dataclass(frozen=True)
class Hello:
    """What a server says first on every connection: the nonce requests must prove with."""

    nonce: str  # hex, 16 random bytes

    def encode(self) -> bytes:
        return _frame(asdict(self))

    @classmethod
    def decode(cls, doc: Any) -> bytes:
        try:
            nonce = bytes.fromhex(str(doc["nonce"]))
        except (KeyError, TypeError, ValueError):
            raise PeerError("protocol", "malformed hello") from None
        if len(nonce) != 16:
            raise PeerError("protocol", "malformed hello")
        return nonce


@dataclass(frozen=True)
class PieceReply:
    size: int = 0  # bytes of the piece that follow
    error: str = ""  # a kind from KINDS, or "" when the piece follows
    message: str = ""
    pending: bool = False  # a heartbeat: the piece is on its way, the answer follows
    tag: int = 0  # the request's tag (0: the oldest request open, a server of old)
    # A run's reply: each block's length in the bytes that follow, in the request's
    # order (0: that block is not sent). () for a piece.
    sizes: tuple[int, ...] = ()
    # Bytes a second at which the server's own pieces of the job come to it (the median
    # of its peers' rates: bootseer.p2p.linkrate); 0: not known, or a server of old. A
    # relay whose own link is slow gets every piece late, however fast its children.
    intake: int = 0

    def encode(self) -> bytes:
        doc: dict[str, object] = {
            "size": self.size,
            "error": self.error,
            "message": self.message,
            "pending": self.pending,
            "tag": self.tag,
        }
        if self.sizes:
            doc["sizes"] = list(self.sizes)
        if self.intake:
            doc["intake"] = self.intake
        return _frame(doc)

    @classmethod
    def decode(cls, doc: Any) -> PieceReply:
        try:
            reply = cls(
                int(doc["size"]),
                str(doc["error"]),
                str(doc["message"]),
                doc.get("pending", False) is True,
                int(doc.get("tag", 0)),
                _sizes(doc.get("sizes", [])),
                int(doc.get("intake", 0)),
            )
        except (KeyError, TypeError, ValueError):
            raise PeerError("protocol", "malformed piece reply") from None
        if not 0 <= reply.tag < 2**31:
            raise PeerError("protocol", f"reply tag {reply.tag} out of bounds")
        if not 0 <= reply.intake < 2**53:
            raise PeerError("protocol", f"intake {reply.intake} out of bounds")
        if not 0 <= reply.size <= MAX_PIECE:
            raise PeerError("protocol", f"piece size {reply.size} out of bounds")
        if reply.sizes and sum(reply.sizes) != reply.size:
            raise PeerError(
                "protocol", f"a run's sizes add up to {sum(reply.sizes)}, not {reply.size}"
            )
        return reply

    def raise_error(self) -> None:
        if self.error:
            kind = one_of(self.error, KINDS) or "protocol"  # or one this version lacks
            raise PeerError(kind, self.message or kind)


def run_digest(blocks: Sequence[str]) -> str:
    """The name a run of blocks is asked by: the SHA-256 of their digests, in order, so
    the request's proof covers exactly these blocks and a server whose image differs
    finds none (``missing``). SHA-256 still, not BLAKE3: it hashes a few hundred bytes of
    names per run, not the blocks' bytes (nothing to gain), and a bare SHA-256 is a
    digest every release's decoder takes::

        >>> run_digest(["ab" * 32]) == run_digest(["cd" * 32])
        False
    """
    h = hashlib.sha256(b"bootseer-run/1\n")
    for d in blocks:
        h.update(d.encode())
        h.update(b"\n")
    return h.hexdigest()


def _index(value: Any) -> int:
    if type(value) is not int or not 0 <= value < 2**31:
        raise ValueError("a block index")
    return value


def _sizes(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > MAX_RUN:
        raise ValueError("sizes")
    out = tuple(int(v) for v in value)
    if any(not 0 <= v <= MAX_PIECE for v in out):
        raise ValueError("sizes")
    return out


def _frame(doc: dict[str, object]) -> bytes:
    body = json.dumps(doc, separators=(",", ":")).encode()
    return struct.pack(">I", len(body)) + body


def read_message(sock: socket.socket, deadline: float | None = None) -> Any | None:
    """The next message's JSON, or None if the peer closed the connection cleanly."""
    head = recv_exact(sock, 4, deadline, eof_ok=True)
    if head is None:
        return None
    (n,) = struct.unpack(">I", head)
    if n > MAX_HEADER:
        raise PeerError("protocol", f"message of {n} bytes is too long")
    body = recv_exact(sock, n, deadline)
    assert body is not None
    try:
        return jsonlimits.loads(body, max_bytes=MAX_HEADER, what="message")
    except ValueError:
        raise PeerError("protocol", "message is not JSON") from None


def recv_exact(
    sock: socket.socket, n: int, deadline: float | None = None, eof_ok: bool = False
) -> bytes | None:
    """``n`` bytes; with a ``deadline`` (monotonic), all of them by then or TimeoutError,
    however slowly the peer trickles them."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        if deadline is not None:
            # Past the deadline, what already arrived still counts: an asker that was not
            # scheduled for a while (a busy node) must not blame the peer for its own delay.
            sock.settimeout(max(0.0, deadline - time.monotonic()))
        try:
            k = sock.recv_into(view[got:])
        except BlockingIOError:  # past the deadline, and nothing more had arrived
            raise TimeoutError(f"{got} of {n} bytes by the deadline") from None
        if k == 0:
            if eof_ok and got == 0:
                return None
            raise PeerError("protocol", f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def recv_piece(sock: socket.socket, n: int, deadline: float) -> bytes:
    """A piece's ``n`` bytes, all of them by ``deadline`` (monotonic) or TimeoutError.

    One ``recv(MSG_WAITALL)`` with the socket blocking and ``SO_RCVTIMEO`` the time left:
    the kernel waits for the whole piece and copies it once into the bytes returned (not
    zeroed first), so a piece costs one system call, not a poll and a recv per segment and
    a copy of the assembled bytes. As in :func:`recv_exact`, what arrived by the deadline
    counts; a piece cut short by the deadline or a signal is assembled in a buffer.
    """
    sock.settimeout(None)
    _rcvtimeo(sock, deadline)
    try:
        first = sock.recv(n, socket.MSG_WAITALL)
    except BlockingIOError:  # SO_RCVTIMEO ran out before any byte came
        first = b""
    if len(first) == n:
        return first
    buf = bytearray(n)
    buf[: len(first)] = first
    got = len(first)
    with memoryview(buf) as view:
        while got < n:
            if time.monotonic() >= deadline:
                with contextlib.suppress(BlockingIOError):  # what is here by now counts
                    got += sock.recv_into(view[got:], n - got, socket.MSG_DONTWAIT)
                if got < n:
                    raise TimeoutError(f"{got} of {n} bytes by the deadline")
                break
            _rcvtimeo(sock, deadline)
            try:
                k = sock.recv_into(view[got:], n - got, socket.MSG_WAITALL)
            except BlockingIOError:
                continue
            if k == 0:
                raise PeerError("protocol", f"connection closed after {got} of {n} bytes")
            got += k
    return bytes(buf)


def _rcvtimeo(sock: socket.socket, deadline: float) -> None:
    left = max(0.001, deadline - time.monotonic())
    sec = int(left)
    tv = struct.pack("ll", sec, int((left - sec) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)


def _wait_at_most(sock: socket.socket, silence: float) -> None:
    """A blocking socket whose each receive ends after ``silence`` seconds without bytes
    (``SO_RCVTIMEO``: with what came, if any; BlockingIOError if none)."""
    sock.settimeout(None)
    tv = struct.pack("ll", int(silence), int((silence - int(silence)) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)


def recv_piece_alive(sock: socket.socket, n: int, silence: float) -> bytes:
    """A piece's ``n`` bytes however long they take while they keep coming: TimeoutError
    once none came for ``silence`` seconds. As :func:`recv_piece`, one ``recv(MSG_WAITALL)``
    a piece when it comes at once (``SO_RCVTIMEO`` ends a wait with what came, if any)."""
    _wait_at_most(sock, silence)
    try:
        first = sock.recv(n, socket.MSG_WAITALL)
    except BlockingIOError:
        raise TimeoutError(f"0 of {n} bytes, then {silence:g}s of silence") from None
    if len(first) == n:
        return first
    if not first:
        raise PeerError("protocol", f"connection closed after 0 of {n} bytes")
    buf = bytearray(n)
    buf[: len(first)] = first
    with memoryview(buf) as view:
        _fill_alive(sock, view, len(first), silence)
    return bytes(buf)


def recv_into_alive(sock: socket.socket, view: memoryview, silence: float) -> None:
    """Fill ``view`` from the socket however long it takes while bytes keep coming:
    TimeoutError once none came for ``silence`` seconds. As :func:`recv_piece_alive`, but
    into the caller's buffer (a run's, page-aligned: its blocks go to the cache's write
    from there), one ``recv_into(MSG_WAITALL)`` when the bytes come at once."""
    _wait_at_most(sock, silence)
    _fill_alive(sock, view, 0, silence)


def _fill_alive(sock: socket.socket, view: memoryview, got: int, silence: float) -> None:
    """``view`` past its first ``got`` bytes from the socket (``SO_RCVTIMEO`` set to
    ``silence``): TimeoutError once none came for that long."""
    n = len(view)
    while got < n:
        try:
            k = sock.recv_into(view[got:], n - got, socket.MSG_WAITALL)
        except BlockingIOError:
            raise TimeoutError(f"{got} of {n} bytes, then {silence:g}s of silence") from None
        if k == 0:
            raise PeerError("protocol", f"connection closed after {got} of {n} bytes")
        got += k
