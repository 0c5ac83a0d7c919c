"""One job's peers as one node sees them: whom to ask for a piece, who is dead, what came whence.

``fetch`` returns a piece from this node's parent in the piece's tree (:mod:`.tree`:
the owner's children ask the owner, their children ask them, and so on, so every node
that holds a piece serves it onward), verified; a parent that is dead or slow or served
bad bytes is skipped for ``dead_for`` seconds (a node never waits on a dead peer twice)
and the next node up the tree is asked, the owner last. None means this node must go
to the store itself: it owns the piece, or every node above it failed::

    >>> swarm = Swarm(42, "n2", ("n1", "n2"), token, resolve, client, log)  # doctest: +SKIP
    >>> data = swarm.fetch(piece_digest, PREFETCH) or store.read_bytes(key)  # doctest: +SKIP

``fetch_run`` asks one node for a run of image blocks in one request (the prefetch's:
:mod:`bootseer.image.prefetch`) and checks each block by its own digest: a bad one
drops the node as a bad piece does, the good ones are kept. A node that answers a run
"missing" (an agent of an older version, which knows no runs) is asked no more runs.
"""

from __future__ import annotations

import threading
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bootseer import digest as digests
from bootseer.errors import describe
from bootseer.image.cache import checked_crcs
from bootseer.p2p.client import Address, ConnectionsFull, PeerClient
from bootseer.p2p.lateness import Lateness
from bootseer.p2p.linkrate import LinkRates
from bootseer.p2p.owner import TREES, owner, owner_index
from bootseer.p2p.tree import ancestors, cousins, label, peers
from bootseer.p2p.wire import PeerError, PieceRequest, run_digest

RESCUE_PEERS = 3  # nodes asked for a piece the store failed (or was late) to give
BACKGROUND = 2  # the fetch priority of a fill (bootseer.image.fetch.BACKGROUND)
# Store reads a job's nodes may have running at once, all together, because a peer was
# late: each node gets its share (one at least). 4 per node was 64 at once on a 16-node
# job, and on a 100 Mbit/s store they read 6x the checkpoint's units.
STORE_HEDGES = 16
# Nodes outside its tree peers a node may ask in place of slow ones, per level of the
# tree (ceil(log2 N) levels): each is one more connection and handshake.
DETOURS_PER_LEVEL = 1


@dataclass
class SwarmStats:
    peer_bytes: int = 0  # verified bytes received from peers
    store_bytes: int = 0  # bytes this node fetched from the store itself (counted by callers)
    peer_failures: int = 0
    corrupt: int = 0  # pieces a peer served with the wrong digest (refused)
    runs: int = 0  # runs of image blocks asked of peers (one request each)
    dropped: dict[str, str] = field(default_factory=dict)  # node -> why it was last dropped


class Swarm:
    def __init__(
        self,
        job_id: int,
        node: str,
        nodes: Sequence[str],
        token: bytes,
        resolve: Callable[[str], Address],
        client: PeerClient,
        log: Callable[[str], None],
        dead_for: float = 30.0,
    ) -> None:
        self.job_id = job_id
        self.node = node
        self.nodes = tuple(nodes)
        self.token = token
        self.resolve = resolve
        self.client = client
        self.log = log
        self.dead_for = dead_for
        self.stats = SwarmStats()
        # How long pieces take from the owners and from the store: a piece later than a
        # few times the usual is asked of the next source too (bootseer.p2p.hedge).
        self.peer_late = Lateness()
        self.store_late = Lateness()
        # Store reads this node may have running at once because a peer was late (not
        # failed): a slow owner's pieces still go around it, while a job whose every
        # piece is late (the store link saturated, the nodes loaded) adds at most
        # STORE_HEDGES to the store's load, not a second read of each piece.
        share = -(-STORE_HEDGES // max(1, len(self.nodes)))
        self.store_hedges = threading.BoundedSemaphore(share)
        # How fast each peer's bytes come once they start (bootseer.p2p.linkrate): a
        # relay on a slow link is asked around, by the nodes that timed it, for as long
        # as a dropped one is.
        self.rates = LinkRates(horizon=dead_for)
        self._dead_until: dict[str, float] = {}
        self._no_runs: set[str] = set()  # nodes that answered a run "missing"
        # A node's place, looked up per piece (a job may have 10,000 nodes).
        self._index = {n: i for i, n in enumerate(self.nodes)}
        self._lock = threading.Lock()
        # Nodes asked in place of a slow one that are none of this node's tree peers (a
        # connection each): at most DETOURS_PER_LEVEL a tree level, so handshakes stay
        # within 2 ceil(log2 N) plus those a drop costs.
        me = self._index.get(node)
        self._peers = peers(me, len(self.nodes)) if me is not None else set()
        self._detours: set[int] = set()
        self._detour_cap = DETOURS_PER_LEVEL * max(1, (len(self.nodes) - 1).bit_length())

    def owner(self, piece: str) -> str | None:
        """The piece's owner (the root of its tree), unless that is this node or it was
        dropped: None."""
        if len(self.nodes) < 2 or self.node not in self._index:
            return None
        o = owner(piece, self.nodes)
        if o == self.node or self._dead_until.get(o, 0.0) > time.monotonic():
            return None
        return o

    def source(self, piece: str, root: int | None = None) -> str | None:
        """The node to ask for ``piece``: this node's parent in the piece's tree (rooted
        at its owner, or at node ``root`` where the caller's rule says: an image's blocks
        by range, :func:`bootseer.p2p.owner.range_owner_index`), or past
        dropped ones the nearest live node above it; with the owner dropped too, the
        owner's first child (label 1), which reads the store for all the owner's children
        (else each would); None when this node fetches it from the store: it owns the
        piece, is that first child, or every node it may ask was dropped. A node on a
        slow link (:attr:`rates`) is passed over like a dropped one, but asked still
        when every other is dropped or slow: the next node up holds the piece before it
        does, and a slow node is no reason to read the store."""
        me = self._index.get(self.node)
        if len(self.nodes) < 2 or me is None:
            return None
        n = len(self.nodes)
        now = time.monotonic()
        if root is None:
            root = owner_index(piece, n)
        chain = ancestors(me, root, n)
        if len(chain) > 0 and label(me, root, n) > 1:
            chain.append((root + 1) % n)  # a lower label: still no cycle
        slow = None
        detours = []
        for i in chain:
            name = self.nodes[i]
            if self._dead_until.get(name, 0.0) > now:
                continue
            if self.rates.slow(name):
                slow = slow or name
                continue
            if slow is None or i in self._peers:
                return name
            detours.append(i)
        if slow is None:
            return None
        # Above this node a slow one: a tree peer at its parent's depth holds the piece
        # as soon as the parent would, on a connection already open; else the nearest
        # node above the slow one, within the detours.
        for i in cousins(me, root, n):
            name = self.nodes[i]
            if self._dead_until.get(name, 0.0) <= now and not self.rates.slow(name):
                return name
        for i in detours:
            if self._detour(i):
                return self.nodes[i]
        return slow

    def _detour(self, i: int) -> bool:
        """Whether node ``i``, none of this node's tree peers, may be asked in place of a
        slow one: it was before, or the detours are not all taken."""
        with self._lock:
            if i in self._detours or len(self._detours) < self._detour_cap:
                self._detours.add(i)
                return True
            return False

    def run_source(self, piece: str, root: int | None = None) -> str | None:
        """The node to ask for ``piece`` in a run (:meth:`source`); None: ask it alone
        (this node reads the store for it, or that node does not know runs)."""
        src = self.source(piece, root)
        return None if src is None or src in self._no_runs else src

    def fetch_run(
        self, node: str, blocks: Sequence[tuple[int, str, int]], priority: int
    ) -> list[tuple[memoryview, array[int]] | None]:
        """Blocks (index in the job's image, digest, length) from ``node`` in one request,
        each checked by its digest: its bytes and their chunk CRCs (the block cache's,
        taken in the same pass: :func:`bootseer.image.cache.checked_crcs`), or None (not
        sent, or bad: the caller asks for it alone). Never raises: a node that fails is
        dropped as in :meth:`fetch`."""
        none: list[tuple[memoryview, array[int]] | None] = [None] * len(blocks)
        if self._dead_until.get(node, 0.0) > time.monotonic():
            return none  # dropped since the run was queued (the fill's, long ago): alone
        names = [d for _, d, _ in blocks]
        req = PieceRequest(
            self.job_id,
            "",
            run_digest(names),
            priority,
            blocks=tuple(i for i, _, _ in blocks),
            trees=TREES,
        )
        with self._lock:
            self.stats.runs += 1
        try:
            data, sizes = self.client.fetch_run(
                self.resolve(node), req, self.token, on_received=self._timer(node)
            )
        except ConnectionsFull:
            return none
        except PeerError as exc:
            if exc.kind == "missing":
                # An agent of an older version knows no runs (it found no block with the
                # run's digest), or its image differs: block by block from now on.
                with self._lock:
                    first = node not in self._no_runs
                    self._no_runs.add(node)
                if first:
                    self.log(f"job={self.job_id} p2p: {node} serves no runs ({exc}): blocks alone")
            elif not (
                exc.kind in ("late", "failed") or (priority >= BACKGROUND and exc.kind == "timeout")
            ):
                self._drop(node, f"{exc.kind}: {exc}")
            return none
        except OSError as exc:
            self._drop(node, f"unreachable: {describe(exc)}")
            return none
        if len(sizes) != len(blocks):
            self._drop(node, f"answered a run of {len(blocks)} blocks with {len(sizes)} sizes")
            return none
        out = list(none)
        view = memoryview(data)
        at = bad = got = 0
        for k, ((_, d, length), size) in enumerate(zip(blocks, sizes, strict=True)):
            part = view[at : at + size]
            at += size
            if size == 0:
                continue  # the node could not get it in time: asked again alone
            crcs = checked_crcs(part, d) if size == length else None
            if crcs is None:
                bad += 1
                continue
            out[k] = (part, crcs)
            got += size
        with self._lock:
            self.stats.peer_bytes += got
            self.stats.corrupt += bad
        if bad:
            self._drop(node, f"served {bad} blocks of a run that do not match their digests")
        return out

    def fetch(
        self,
        piece: str,
        priority: int,
        where: tuple[str, str, int, int] | None = None,
        on_pending: Callable[[], None] | None = None,
        root: int | None = None,
    ) -> bytes | None:
        """``piece`` from the nearest live node above this one in its tree (``root``: as
        in :meth:`source`), verified;
        None: fetch it from the store yourself. ``where`` (target, store key, offset,
        length) locates a piece outside an image. A node that fails is dropped and the
        next one up asked; one that fails without being dropped (a fill held back) sends
        this node to the store. The answer times feed ``peer_late`` (bootseer.p2p.hedge);
        ``on_pending`` is called while the node asked is getting the piece itself."""
        tried: set[str] = set()
        while (src := self.source(piece, root)) is not None and src not in tried:
            tried.add(src)
            t0 = time.monotonic()
            data = self._ask(src, piece, priority, where, on_pending=on_pending)
            if data is not None:
                self.peer_late.record(time.monotonic() - t0)
                return data
        return None

    def rescue(
        self, piece: str, priority: int, where: tuple[str, str, int, int] | None = None
    ) -> bytes | None:
        """``piece`` from any of a few other live nodes, for when the store failed: one
        that holds it (an earlier job's, a fill's) still serves it. None if none does."""
        others = [
            n
            for n in self.nodes
            if n != self.node and self._dead_until.get(n, 0.0) <= time.monotonic()
        ]
        start = int(digests.encoded(piece)[:8], 16)
        for k in range(min(RESCUE_PEERS, len(others))):
            node = others[(start + k) % len(others)]
            data = self._ask(node, piece, priority, where, cached_only=True)
            if data is not None:
                return data
        return None

    def _ask(
        self,
        o: str,
        piece: str,
        priority: int,
        where: tuple[str, str, int, int] | None,
        cached_only: bool = False,
        on_pending: Callable[[], None] | None = None,
    ) -> bytes | None:
        target, key, offset, length = where or ("", "", 0, 0)
        req = PieceRequest(
            self.job_id,
            "",
            piece,
            priority,
            key,
            offset,
            length,
            target,
            cached_only,
            trees="" if key else TREES,
        )
        try:
            data = self.client.fetch(
                self.resolve(o), req, self.token, on_pending, on_received=self._timer(o)
            )
        except ConnectionsFull:  # this node's own bound, not the peer's fault
            return None
        except PeerError as exc:
            # Not holding a piece is no fault; nor is an owner that holds a fill back
            # while its own job starts (the fill is in no hurry, the peer is alive); nor
            # is a peer that answered it could not get the piece in time ("failed": its
            # own parent or the store was slow or down) or was still getting it ("late"):
            # in a tree a relay waits on the nodes above it, and dropping it for their
            # slowness sent every piece below it to the store (1436 MiB of store egress
            # for a 16-node job that needs 231, at load 40-140).
            busy = exc.kind in ("late", "failed") or (
                priority >= BACKGROUND and exc.kind == "timeout"
            )
            if not (cached_only and exc.kind == "missing") and not busy:
                self._drop(o, f"{exc.kind}: {exc}")
            return None
        except OSError as exc:  # the name did not resolve, or the connection failed
            self._drop(o, f"unreachable: {describe(exc)}")
            return None
        if not digests.matches(data, piece):
            with self._lock:
                self.stats.corrupt += 1
            self._drop(o, f"served {len(data)} bytes that do not match piece {piece[:12]}")
            return None
        with self._lock:
            self.stats.peer_bytes += len(data)
        return data

    def _timer(self, node: str) -> Callable[[int, float, int], None]:
        """What the client tells of a piece's bytes from ``node``: to its rates."""
        return lambda nbytes, seconds, intake: self.rates.record(node, nbytes, seconds, intake)

    def count_store(self, nbytes: int) -> None:
        with self._lock:
            self.stats.store_bytes += nbytes

    def _drop(self, node: str, why: str) -> None:
        if self.client.closed:
            # This node's own client was closed (its agent stopping, for a restart or an
            # upgrade): the requests it cut short say nothing of the peer.
            return
        with self._lock:
            self.stats.peer_failures += 1
            self.stats.dropped[node] = why
            self._dead_until[node] = time.monotonic() + self.dead_for
        self.log(f"job={self.job_id} p2p: peer {node} dropped for {self.dead_for:g}s: {why}")
