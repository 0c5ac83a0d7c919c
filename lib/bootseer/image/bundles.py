"""Bundles: a trace's hot blocks stored once more, in trace order, as objects of a few MiB.

Each block is its own object in the store, named by its digest (:mod:`bootseer.image.blocks`),
so a cold node fetching the hot set block by block makes one request per block: a
``HEAD`` and a ``GET`` of 256 KiB each on S3, which cost the store 6.4 CPU-s and the
node 2.5 per GiB where GETs of 4 MiB cost 1.6 and 0.8 (docs/performance.md, "What a GET
costs by its size"). At real sizes, behind a fast link, those requests set the start.

So when a trace is saved, the job's first node cuts the trace's
blocks, in trace order, into chunks of ``bundle_blocks`` and writes each chunk's bytes as
one object, a *bundle*, then names the bundles in the trace (:meth:`Trace.with_bundles`). A
bundle's id is the digest of its blocks' digests, so the same chunk is one bundle whoever's
trace holds it, and a chunk a merge leaves as it was keeps its bundle. A cold node's
prefetch reads the hot set through :class:`BundleSource`: a run of a bundle's blocks is one
ranged read (:mod:`bootseer.image.prefetch` builds runs as it does for a peer), and each
block is still checked against its own digest before anything keeps it. A bundle is only
ever a faster way to the same bytes: one that is missing, short or wrong costs its
blocks a read each, from the store as before::

    >>> bundle_id(["ab" * 32, "cd" * 32]) == bundle_id(["ab" * 32, "cd" * 32])
    True
    >>> bundle_key("ef" * 32, "01" * 32)[:30]
    'images/traces/efefefefefefefef'

Bundles live beside the image's traces (``images/traces/<image id>/bundles/<bundle id>``);
:mod:`bootseer.image.gc` removes those no trace names, and all of them with the image.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bootseer.errors import describe
from bootseer.image.cache import checked_crcs
from bootseer.image.fetch import RunBlock, RunPart, StoreSource
from bootseer.image.manifest import Manifest
from bootseer.image.trace import BUNDLE_ID, Trace, traces_dir
from bootseer.store import Store

BUNDLES = "bundles"  # under an image's traces directory


def bundle_id(block_digests: Sequence[str]) -> str:
    """A bundle's id: the SHA-256 of its blocks' digests, in order (64 hex digits)."""
    return hashlib.sha256("\n".join(block_digests).encode()).hexdigest()


def bundle_key(image_id: str, bid: str) -> str:
    if not BUNDLE_ID.fullmatch(bid):
        raise ValueError(f"{bid!r} is not a bundle id")
    return f"{traces_dir(image_id)}/{BUNDLES}/{bid}"


def bundle_blocks_for(bundle_kib: int, block_size: int) -> int:
    """Blocks per bundle for ``[image] bundle_kib``: 0 (no bundles) when a bundle would hold one."""
    n = (bundle_kib << 10) // block_size
    return n if n >= 2 else 0


@dataclass(frozen=True)
class Place:
    """Where a block is in a bundle: the bundle's key, its offset there."""

    key: str
    offset: int


def index(manifest: Manifest, traces: Sequence[Trace | None]) -> dict[str, Place]:
    """Each bundled block's place (by digest), from ``traces`` in order: a block two
    traces bundle is read from the first's."""
    places: dict[str, Place] = {}
    for t in traces:
        if t is None or not t.bundle_blocks:
            continue
        for chunk, bid in zip(t.chunks(t.bundle_blocks), t.bundles, strict=False):
            if bid is None:
                continue
            key, offset = bundle_key(manifest.id, bid), 0
            for i in chunk:
                places.setdefault(manifest.blocks[i], Place(key, offset))
                offset += manifest.block_length(i)
    return places


@dataclass
class BundleStats:
    reads: int = 0  # ranged reads of bundles
    blocks: int = 0  # blocks they brought, checked
    bytes: int = 0
    refused: int = 0  # blocks a bundle held wrong, or not at all: each read alone after
    errors: list[str] = field(default_factory=list)  # the first few reads that failed


class BundleSource:
    """The store's blocks (as :class:`StoreSource`), and the bundled ones also in runs:
    a :class:`bootseer.image.fetch.RunSource` whose "peers" are bundles. A run is read in
    one ranged read per stretch of blocks adjacent in the bundle (all of it, on a cold
    node), each block checked by its digest; a block the bundle did not give is None, and
    the fetcher asks for it alone, from the store."""

    def __init__(self, origin: StoreSource, places: dict[str, Place]) -> None:
        self.origin = origin
        self.store = origin.store
        self.places = places
        self.keys = frozenset(p.key for p in places.values())
        self.stats = BundleStats()
        self._lock = threading.Lock()  # the stats: the fetcher's threads read runs at once

    def read_block(
        self, index: int, block_digest: str, offset: int, length: int, priority: int
    ) -> bytes:
        return self.origin.read_block(index, block_digest, offset, length, priority)

    def describe(self) -> str:
        return self.origin.describe()

    def holds(self, peer: str) -> bool:
        """Whether ``peer`` (a run's, :meth:`run_peer`'s) is one of these bundles."""
        return peer in self.keys

    def run_peer(self, block_digest: str) -> str | None:
        place = self.places.get(block_digest)
        return place.key if place is not None else None

    def read_run(
        self, peer: str, blocks: Sequence[RunBlock], priority: int
    ) -> list[RunPart | None]:
        out: list[RunPart | None] = [None] * len(blocks)
        for start, end, members in self._stretches(peer, blocks):
            try:
                data = memoryview(self.store.read_range_view(peer, start, end - start))
            except Exception as exc:  # the blocks are read alone next: say why once
                with self._lock:
                    self.stats.refused += len(members)
                    if len(self.stats.errors) < 5:
                        self.stats.errors.append(f"{peer}: {describe(exc)}")
                continue
            got = refused = 0
            for k, offset in members:
                _, d, length = blocks[k]
                part = data[offset - start : offset - start + length]
                crcs = checked_crcs(part, d) if len(part) == length else None
                if crcs is None:
                    refused += 1
                    continue
                out[k] = (part, crcs)
                got += length
            with self._lock:
                self.stats.reads += 1
                self.stats.blocks += len(members) - refused
                self.stats.bytes += got
                self.stats.refused += refused
        return out

    def _stretches(
        self, key: str, blocks: Sequence[RunBlock]
    ) -> list[tuple[int, int, list[tuple[int, int]]]]:
        """The run's blocks in bundle ``key`` as stretches adjacent there: (start, end,
        [(the block's place in the run, its offset in the bundle)])."""
        found = []
        for k, (_, d, length) in enumerate(blocks):
            place = self.places.get(d)
            if place is not None and place.key == key:
                found.append((place.offset, length, k))
        found.sort()
        stretches: list[tuple[int, int, list[tuple[int, int]]]] = []
        for offset, length, k in found:
            if stretches and stretches[-1][1] == offset:
                start, _, members = stretches[-1]
                stretches[-1] = (start, offset + length, members)
            else:
                members = []
                stretches.append((offset, offset + length, members))
            members.append((k, offset))
        return stretches


def bundled_chunks(manifest: Manifest, trace: Trace, bundle_blocks: int, max_bytes: int) -> int:
    """How many of ``trace``'s chunks are bundled at most: those within ``max_bytes``."""
    total = n = 0
    for chunk in trace.chunks(bundle_blocks):
        total += sum(manifest.block_length(i) for i in chunk)
        if total > max_bytes:
            break
        n += 1
    return n


def complete(manifest: Manifest, trace: Trace, bundle_blocks: int, max_bytes: int) -> bool:
    """Whether ``trace`` names a bundle for every chunk it may have one for."""
    want = bundled_chunks(manifest, trace, bundle_blocks, max_bytes)
    if not want:
        return True
    return (
        trace.bundle_blocks == bundle_blocks
        and len(trace.bundles) >= want
        and None not in trace.bundles[:want]
    )


@dataclass
class Bundled:
    """What :func:`write_bundles` did."""

    bundles: list[str | None]  # each chunk's bundle id; None: not stored (a block not here)
    written: int = 0  # bundles written now
    bytes: int = 0
    kept: int = 0  # bundles already in the store


def write_bundles(
    store: Store,
    manifest: Manifest,
    trace: Trace,
    bundle_blocks: int,
    read: Callable[[str, int], bytes | None],
    max_bytes: int,
    before_write: Callable[[], None] = lambda: None,
) -> Bundled:
    """Store ``trace``'s chunks of ``bundle_blocks`` as bundles, up to ``max_bytes`` of
    them (the rest: None), their blocks' bytes from ``read(digest, length)`` (None: not
    here, the chunk is not bundled). A bundle the trace already names, or the store
    already holds, is not written again; ``before_write`` runs before each write (the
    agent waits there for its jobs' starts to be quiet). Store errors propagate."""
    named = set(trace.bundles) if trace.bundle_blocks == bundle_blocks else set()
    done = Bundled([])
    for chunk in trace.chunks(bundle_blocks)[
        : bundled_chunks(manifest, trace, bundle_blocks, max_bytes)
    ]:
        digests = [manifest.blocks[i] for i in chunk]
        size = sum(manifest.block_length(i) for i in chunk)
        bid = bundle_id(digests)
        key = bundle_key(manifest.id, bid)
        if bid in named or store.exists(key):
            done.bundles.append(bid)
            done.kept += 1
            continue
        parts = [read(d, manifest.block_length(i)) for d, i in zip(digests, chunk, strict=True)]
        if any(p is None for p in parts):
            done.bundles.append(None)
            continue
        before_write()
        # In place: nothing reads a bundle before a trace names it, and a reader checks
        # every block of it anyway.
        store.write_bytes(key, b"".join(p for p in parts if p is not None), atomic=False)
        done.bundles.append(bid)
        done.written += 1
        done.bytes += size
    while done.bundles and done.bundles[-1] is None:
        done.bundles.pop()
    return done
