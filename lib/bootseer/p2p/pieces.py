"""Located pieces: byte ranges of store objects (a snapshot's frames), shared like blocks.

An image block is found by its digest in the image's manifest; a snapshot frame or a
checkpoint unit is not in any manifest the agent holds, so its request carries where it
is: a store (the main store, or one of the site's checkpoint targets), a key, an offset
and a length, and the digest the piece must have (:mod:`bootseer.digest`). The agent
fetches each once per node (concurrent askers wait for the one fetch), from the piece's
owner among the job's nodes or, if this node owns it, from the store; verifies it; and
keeps it in the block cache, where peers and the node's own restore find it::

    >>> data, source = pieces.get(
    ...     swarm, Located("", "deps/u/k/data.tar.zst", 0, 4096, digest), ...
    ... )  # doctest: +SKIP
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import re
import threading
from array import array
from collections.abc import Callable
from dataclasses import dataclass

from bootseer import digest as digests
from bootseer.agentapi.jobs import PieceSource
from bootseer.errors import describe
from bootseer.image.cache import BlockCache, Where
from bootseer.p2p.fallback import fetch_piece
from bootseer.p2p.swarm import Swarm
from bootseer.p2p.wire import MAX_PIECE, PeerError
from bootseer.store import Store

# What a located piece may be: a snapshot's archive in the main store, or a checkpoint
# unit on a target. A peer proves it is a root agent of the job; it still cannot make
# this node read anything else.
MAIN_STORE_KEY = re.compile(r"deps/[^/]+(/[^/]+)+")
TARGET_KEY = re.compile(r"[^/]+(/[^/]+)*/units/[^/]+/[^/]+")

Source = PieceSource


@dataclass(frozen=True)
class Located:
    target: str  # "" for the main store, else a checkpoint target's URI
    key: str
    offset: int
    length: int
    digest: str

    def check(self) -> None:
        parts = self.key.split("/")
        pattern = TARGET_KEY if self.target else MAIN_STORE_KEY
        if (
            not pattern.fullmatch(self.key)
            or any(p in ("", ".", "..") for p in parts)
            or not 0 < self.length <= MAX_PIECE
            or self.offset < 0
            or not digests.valid(self.digest)
        ):
            raise PeerError("missing", f"not a piece this node serves: {self.key[:100]!r}")


class Pieces:
    def __init__(
        self, store: Store, cache: BlockCache, target: Callable[[str], Store | None]
    ) -> None:
        self.store = store
        self.cache = cache
        self.target = target  # a checkpoint target's URI -> its store; None if not one
        self._inflight: dict[str, cf.Future[tuple[bytes, Source]]] = {}
        # Where pieces fetched for a peer came from, until this node's own restore takes
        # them: its record then says what this node fetched (from the store, for the job).
        self._unclaimed: dict[str, Source] = {}
        self._lock = threading.Lock()

    def get(
        self, swarm: Swarm | None, loc: Located, priority: int, timeout: float, local: bool
    ) -> tuple[bytes, Source]:
        """The piece's verified bytes and where they came from: cache, peer or store.
        ``local``: for this node's own use (else for a peer)."""
        loc.check()
        data = self.cache.read(loc.digest, 0, loc.length)
        if data is not None:
            return data, self._cached_source(loc.digest, local)
        with self._lock:
            fut = self._inflight.get(loc.digest)
            mine = fut is None
            if fut is None:
                fut = self._inflight[loc.digest] = cf.Future()
        if not mine:
            data, _ = fut.result(timeout=timeout)
            return self.get(swarm, loc, priority, timeout, local) if local else (data, "cache")
        try:
            result = self._fetch(swarm, loc, priority)
            if not local:
                with self._lock:
                    self._unclaimed[loc.digest] = result[1]
                    while len(self._unclaimed) > 100_000:  # a restore that never came
                        del self._unclaimed[next(iter(self._unclaimed))]
            fut.set_result(result)
            return result
        except BaseException as exc:
            fut.set_exception(exc)
            raise
        finally:
            with self._lock:
                self._inflight.pop(loc.digest, None)

    def held(self, loc: Located, local: bool) -> tuple[int, Where, array[int], Source] | None:
        """If the cache holds the piece: its pack opened, where the piece lies in it, its
        CRCs and where it came from, for root's own process that asked to read and check
        it (:meth:`BlockCache.open_held`); else None (:meth:`get` fetches it)."""
        loc.check()
        opened = self.cache.open_held(loc.digest)
        if opened is None:
            return None
        fd, where, crcs = opened
        if where.size != loc.length:
            os.close(fd)
            return None
        return fd, where, crcs, self._cached_source(loc.digest, local)

    def _cached_source(self, digest: str, local: bool) -> Source:
        """A cache hit's source: for this node's own use, where a peer's ask had it
        fetched from, once (its record then says what this node fetched)."""
        if not local:
            return "cache"
        with self._lock:
            return self._unclaimed.pop(digest, "cache")

    def _fetch(self, swarm: Swarm | None, loc: Located, priority: int) -> tuple[bytes, Source]:
        store = self.target(loc.target) if loc.target else self.store

        def from_store() -> bytes:
            if store is None:
                raise PeerError("missing", f"{loc.target[:100]!r} is not a checkpoint target")
            try:
                data = store.read_range(loc.key, loc.offset, loc.length)
            except Exception as exc:
                raise PeerError("failed", f"{loc.key} at {loc.offset}: {describe(exc)}") from None
            if not digests.matches(data, loc.digest):
                raise PeerError(
                    "failed", f"{loc.key} at {loc.offset}: digest mismatch in the store"
                )
            if swarm is not None:
                swarm.count_store(len(data))  # out of the store, whoever won
            return data

        if swarm is None:
            data, where = from_store(), "store"
        else:
            # The owner, the store, the nodes that hold it: each asked once the one before
            # is late or cannot (a checkpoint unit's target down or hung included).
            where_ = (loc.target, loc.key, loc.offset, loc.length)
            data, where = fetch_piece(swarm, loc.digest, priority, from_store, where_)
        source: Source = "store" if where == "store" else "peer"
        self.cache.put(loc.digest, data)
        return data, source
