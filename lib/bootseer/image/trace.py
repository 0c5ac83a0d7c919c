"""Traces: the order in which a job first read each block of its image while starting.

The agent records, per job, each block's first access from the prolog until the job
marks its first step (``bootseer image first-step``) or the trace window ends. The
epilog stores the trace for the image after the first run, and merges when a later
run read blocks the stored trace lacked (the stored order first, then the new
blocks in the order that run read them).

Traces are kept per image and user (``images/traces/<image id>/<user>.json``): the
agent writes a job's trace only under its own user's name, so no user's jobs change
what another user's jobs prefetch. A job prefetches its image's *owner*'s trace first
(a named image's ``trace_owner``, set by the admin's ``bootseer image add
--trace-owner``; a path image's: the file's owner, who can change its bytes anyway),
then the blocks of its own user's trace that the owner's lacks (:func:`hot_order`).

A stored trace is checked when loaded: its seal, format, image id, block count and
size, every index inside the image, no repeats, its bundles, and a checksum over all of
it. A bad one is ignored with a log line: prefetch is an optimisation, never a reason
to fail a job.

A trace may also name its *bundles* (:mod:`bootseer.image.bundles`): its blocks, cut in
trace order into chunks of ``bundle_blocks``, each stored once more as one object, so a
cold node reads the hot set in requests of several MiB rather than one per block.
``bundles`` holds each chunk's bundle id, or None for a chunk not (yet) stored as a bundle.

    >>> t = Trace(image="ab" * 32, nblocks=10, block_size=65536, blocks=(3, 0, 7))
    >>> Trace.from_json(t.to_json(), t.image, 10, 65536).blocks
    (3, 0, 7)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pwd
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bootseer import jsonlimits, sitekey
from bootseer.errors import StoreError
from bootseer.image.manifest import Manifest, manifest_key
from bootseer.recordcache import RecordCache
from bootseer.sitekey import SealError, SiteKeys
from bootseer.store import Store
from bootseer.users import check_user, is_user_name

FORMAT = "bootseer-trace/1"
MAX_TRACE_BYTES = 64 << 20  # millions of block numbers: more than any image has blocks
BUNDLE_ID = re.compile(r"[0-9a-f]{64}")  # bootseer.image.bundles.bundle_id


class TraceError(StoreError):
    """A stored trace does not fit its image or is damaged."""


@dataclass(frozen=True)
class Trace:
    image: str
    nblocks: int
    block_size: int
    blocks: tuple[int, ...]
    runs: int = 1
    bundle_blocks: int = 0  # blocks per bundle (0: no bundles)
    bundles: tuple[str | None, ...] = ()  # each chunk's bundle id; None: not stored as one

    def _body(self) -> dict[str, object]:
        body: dict[str, object] = {
            "format": FORMAT,
            "image": self.image,
            "nblocks": self.nblocks,
            "block_size": self.block_size,
            "blocks": list(self.blocks),
            "runs": self.runs,
        }
        if self.bundle_blocks:  # (a trace without bundles reads as before they were)
            body["bundle_blocks"] = self.bundle_blocks
            body["bundles"] = list(self.bundles)
        return body

    def to_json(self) -> bytes:
        body = self._body()
        body["checksum"] = _checksum(body)
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes, image: str, nblocks: int, block_size: int) -> Trace:
        try:
            doc: Any = jsonlimits.loads(raw, max_bytes=MAX_TRACE_BYTES, what="trace")
            checksum = doc.pop("checksum", None)
        except jsonlimits.JSONLimitError as exc:
            raise TraceError(str(exc)) from None
        except (ValueError, AttributeError):
            raise TraceError("trace is not a JSON object") from None
        if doc.get("format") != FORMAT:
            raise TraceError(f"trace format {doc.get('format')!r} is not {FORMAT}")
        if checksum != _checksum(doc):
            raise TraceError("trace checksum does not match its content")
        if doc.get("image") != image:
            raise TraceError(f"trace is for image {str(doc.get('image'))[:12]}, not {image[:12]}")
        if doc.get("nblocks") != nblocks or doc.get("block_size") != block_size:
            raise TraceError(
                f"trace is for {doc.get('nblocks')} blocks of "
                f"{doc.get('block_size')} bytes, the image has {nblocks} of "
                f"{block_size}"
            )
        blocks = doc.get("blocks")
        if not isinstance(blocks, list) or not all(
            isinstance(b, int) and not isinstance(b, bool) for b in blocks
        ):
            raise TraceError("trace blocks are not a list of block numbers")
        outside = [b for b in blocks if not 0 <= b < nblocks]
        if outside:
            raise TraceError(
                f"trace names block {outside[0]} outside the image (blocks 0-{nblocks - 1})"
            )
        if len(set(blocks)) != len(blocks):
            raise TraceError("trace names a block twice")
        runs = doc.get("runs", 1)
        bundle_blocks, bundles = _bundles(doc, len(blocks))
        return cls(
            image,
            nblocks,
            block_size,
            tuple(blocks),
            runs if isinstance(runs, int) else 1,
            bundle_blocks,
            bundles,
        )

    def merged(self, order: Sequence[int]) -> Trace | None:
        """This trace plus the blocks of ``order`` it lacks, or None if it lacks none.
        Its bundles of whole chunks stay (the new blocks go after them); the last, partial
        chunk's does not: that chunk now holds more."""
        have = set(self.blocks)
        new = [b for b in order if b not in have]
        if not new:
            return None
        whole = len(self.blocks) // self.bundle_blocks if self.bundle_blocks else 0
        return Trace(
            self.image,
            self.nblocks,
            self.block_size,
            (*self.blocks, *new),
            self.runs + 1,
            self.bundle_blocks if whole else 0,
            self.bundles[:whole] if whole else (),
        )

    def chunks(self, bundle_blocks: int) -> list[tuple[int, ...]]:
        """The trace's blocks cut, in its order, into chunks of ``bundle_blocks``."""
        b = self.blocks
        return [b[k : k + bundle_blocks] for k in range(0, len(b), bundle_blocks)]

    def with_bundles(self, bundle_blocks: int, bundles: Sequence[str | None]) -> Trace:
        return dataclasses.replace(self, bundle_blocks=bundle_blocks, bundles=tuple(bundles))


def _bundles(doc: dict[str, Any], nblocks: int) -> tuple[int, tuple[str | None, ...]]:
    """A loaded trace's ``(bundle_blocks, bundles)``, checked: (0, ()) if it names none."""
    bundle_blocks = doc.get("bundle_blocks", 0)
    bundles = doc.get("bundles", [])
    if bundle_blocks == 0 and not bundles:
        return 0, ()
    if not isinstance(bundle_blocks, int) or isinstance(bundle_blocks, bool) or bundle_blocks < 1:
        raise TraceError(f"trace bundle_blocks {bundle_blocks!r} is not a positive block count")
    if not isinstance(bundles, list) or len(bundles) > -(-nblocks // bundle_blocks):
        raise TraceError("trace bundles are not a list of one bundle id per chunk of its blocks")
    if not all(p is None or (isinstance(p, str) and BUNDLE_ID.fullmatch(p)) for p in bundles):
        raise TraceError("trace bundles name something that is no bundle id")
    return bundle_blocks, tuple(bundles)


def _checksum(body: dict[str, object]) -> str:
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def trace_user(uid: int) -> str | None:
    """The name traces of ``uid``'s jobs are kept under; None without one (nothing kept)."""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return None
    return name if is_user_name(name) else None


def traces_dir(image_id: str) -> str:
    return (
        manifest_key(image_id).replace("images/manifests/", "images/traces/").removesuffix(".json")
    )


def trace_key(image_id: str, user: str) -> str:
    """Where ``user``'s jobs keep their trace of the image: written by the agent for
    those jobs only, and sealed at this very key."""
    return f"{traces_dir(image_id)}/{check_user(user)}.json"


def hot_order(owner: Trace | None, own: Trace | None) -> tuple[int, ...]:
    """The blocks to prefetch: the image owner's trace, then the job user's own blocks
    that it lacks, each in its recorded order.

    >>> hot_order(Trace("a", 9, 1, (3, 1)), Trace("a", 9, 1, (1, 5, 3, 0)))
    (3, 1, 5, 0)
    """
    first = owner.blocks if owner else ()
    seen = set(first)
    return (*first, *(b for b in (own.blocks if own else ()) if b not in seen))


def load_trace(
    store: Store,
    manifest: Manifest,
    log: Callable[[str], None] = lambda _: None,
    *,
    keys: SiteKeys | None,
    user: str,
    records: RecordCache | None = None,
) -> Trace | None:
    """``user``'s stored trace for this image, or None if there is none or it is bad
    (logged); with ``keys`` (a root-run reader), one that does not verify is bad. With
    ``records`` too, the node's copy serves when the store fails or is slow."""
    key = trace_key(manifest.id, user)
    limit = MAX_TRACE_BYTES + sitekey.SEAL_BYTES + 1
    try:
        if records is not None and keys is not None:
            raw = records.latest(store, key, limit, sitekey.IMAGE_TRACE, keys)
        else:
            raw = store.read_bytes(key, limit=limit)
    except FileNotFoundError:
        return None
    except StoreError as exc:
        log(f"trace for image {manifest.id[:12]} not read: {exc}")
        return None
    try:
        raw = sitekey.open_with(keys, sitekey.IMAGE_TRACE, key, raw)
        return Trace.from_json(raw, manifest.id, manifest.nblocks, manifest.block_size)
    except (TraceError, SealError) as exc:
        log(f"trace {key} ignored: {exc}")
        return None


def save_trace(store: Store, trace: Trace, *, keys: SiteKeys | None, user: str) -> None:
    key = trace_key(trace.image, user)
    store.write_bytes(key, sitekey.seal_with(keys, sitekey.IMAGE_TRACE, key, trace.to_json()))


class Recorder:
    """First accesses of one job's reads, until stopped or the window ends."""

    def __init__(self, nblocks: int, window: float) -> None:
        self._seen = bytearray(nblocks)
        self._lock = threading.Lock()
        self.order: list[int] = []
        self.until = time.monotonic() + window
        self.active = window > 0

    def record(self, first: int, last: int) -> None:
        if not self.active:
            return
        if time.monotonic() > self.until:
            self.active = False
            return
        with self._lock:
            for i in range(first, min(last, len(self._seen) - 1) + 1):
                if not self._seen[i]:
                    self._seen[i] = 1
                    self.order.append(i)

    def stop(self) -> None:
        self.active = False
