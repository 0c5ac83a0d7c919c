"""An image's manifest: its size, block size and each block's digest.

The image's id is the SHA-256 of the manifest's canonical form, so the id names the
content exactly and a trace recorded for one id never applies to another image::

    >>> m = Manifest(size=5, block_size=65536, blocks=(digest(b"hello"),))
    >>> m.block_length(0), len(m.id), m.format
    (5, 64, 'bootseer-image/2')

``bootseer-image/2`` names its blocks by BLAKE3 (``blake3:<hex>``, :mod:`bootseer.digest`);
``bootseer-image/1``, what images added before were, by SHA-256 (bare hex), and is read
as it is: its id, blocks and traces stay what they were. An agent of a release before
/2 refuses a /2 manifest (its format): the job starts without bootseer's image.

Manifests live in the store at ``images/manifests/<id>.json``. Loading one checks
everything a later read relies on (digest syntax, block count, the id itself).
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bootseer import digest as digests
from bootseer import jsonlimits, sitekey
from bootseer.errors import ManifestError
from bootseer.image.blocks import (
    BLOCKS,
    block_count,
    block_key,
    check_block_size,
    cut,
    digest,
    key_digest,
)
from bootseer.recordcache import RecordCache
from bootseer.sitekey import SiteKeys
from bootseer.store import Store

FORMAT = "bootseer-image/2"  # what new manifests are: blocks named by BLAKE3
FORMAT_SHA256 = "bootseer-image/1"  # before: blocks named by SHA-256 alone
# 4 million blocks (256 GB at 64 KiB blocks, 1 TB at 256 KiB): more is refused unread.
MAX_BLOCKS = 4 << 20
MAX_MANIFEST_BYTES = 288 << 20
MAX_RECORD_BYTES = 64 << 10  # a name or path record

# progress(done_bytes, total_bytes, uploaded_bytes)
Progress = Callable[[int, int, int], None]


@dataclass(frozen=True)
class Manifest:
    size: int
    block_size: int
    blocks: tuple[str, ...]
    format: str = FORMAT

    @functools.cached_property
    def id(self) -> str:  # computed once: it hashes every digest
        h = hashlib.sha256(f"{self.format} {self.size} {self.block_size}\n".encode())
        for d in self.blocks:
            h.update(d.encode())
            h.update(b"\n")
        return h.hexdigest()

    @property
    def nblocks(self) -> int:
        return len(self.blocks)

    def index_of(self, block_digest: str) -> int | None:
        """The block's first place in the image (a block the image holds twice, zeros,
        is one block); None: no block of this image."""
        return self._first_places.get(block_digest)

    @functools.cached_property
    def _first_places(self) -> dict[str, int]:  # built once, on the first ask
        return {d: i for i, d in reversed(list(enumerate(self.blocks)))}

    def block_length(self, index: int) -> int:
        return min(self.block_size, self.size - index * self.block_size)

    def to_json(self) -> bytes:
        doc = {
            "format": self.format,
            "id": self.id,
            "size": self.size,
            "block_size": self.block_size,
            "blocks": list(self.blocks),
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes, expect_id: str | None = None) -> Manifest:
        try:
            doc: Any = jsonlimits.loads(raw, max_bytes=MAX_MANIFEST_BYTES, what="manifest")
            form = doc.get("format")
            if form not in (FORMAT, FORMAT_SHA256):
                raise ValueError(f"format {form!r} is neither {FORMAT} nor {FORMAT_SHA256}")
            size, bs, blocks = doc["size"], doc["block_size"], doc["blocks"]
            if not isinstance(size, int) or size <= 0 or not isinstance(bs, int):
                raise ValueError("bad size or block size")
            check_block_size(bs)
            if not isinstance(blocks, list) or len(blocks) != block_count(size, bs):
                raise ValueError("block list does not match the size")
            if not all(digests.valid(d) for d in blocks):
                raise ValueError("a block digest is not one (bootseer.digest)")
            if form == FORMAT_SHA256 and any(digests.algorithm(d) != "sha256" for d in blocks):
                raise ValueError(f"a block digest of a {FORMAT_SHA256} manifest is not SHA-256")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ManifestError(f"bad image manifest: {exc}") from None
        m = cls(size=size, block_size=bs, blocks=tuple(blocks), format=form)
        if doc.get("id") != m.id or (expect_id is not None and m.id != expect_id):
            raise ManifestError(
                f"image manifest {expect_id or doc.get('id')}: id does not match its content"
            )
        return m


def max_path_image_bytes(max_image_gib: float, block_size: int) -> int:
    """The largest path image the agent registers: ``image.max_image_gib``, and no more
    blocks than a manifest may hold (one it could not read back would be hashed anew by
    every job).

    >>> max_path_image_bytes(256, 256 << 10) == 256 << 30
    True
    >>> max_path_image_bytes(4096, 64 << 10) == MAX_BLOCKS * (64 << 10)
    True
    """
    return min(int(max_image_gib * (1 << 30)), MAX_BLOCKS * block_size)


def manifest_key(image_id: str) -> str:
    if not digests.valid(image_id) or digests.algorithm(image_id) != "sha256":
        raise ManifestError(f"{image_id!r} is not an image id (64 hex digits)")
    return f"images/manifests/{image_id}.json"


def load_manifest(
    store: Store, image_id: str, *, keys: SiteKeys | None, records: RecordCache | None = None
) -> Manifest:
    """The image's manifest; with ``keys`` (a root-run reader) only a sealed one, and with
    ``records`` too the node's copy when it has one (its key is its content's digest)."""
    key = manifest_key(image_id)
    limit = MAX_MANIFEST_BYTES + sitekey.SEAL_BYTES + 1
    try:
        if records is not None and keys is not None:
            raw = records.fixed(store, key, limit, sitekey.IMAGE_MANIFEST, keys)
        else:
            raw = store.read_bytes(key, limit=limit)
    except FileNotFoundError:
        raise ManifestError(f"image {image_id} has no manifest in {store.uri}") from None
    raw = sitekey.open_with(keys, sitekey.IMAGE_MANIFEST, key, raw)
    return Manifest.from_json(raw, expect_id=image_id)


def save_manifest(store: Store, manifest: Manifest, *, keys: SiteKeys | None) -> None:
    key = manifest_key(manifest.id)
    store.write_bytes(key, sitekey.seal_with(keys, sitekey.IMAGE_MANIFEST, key, manifest.to_json()))


def hash_file(path: str, block_size: int, progress: Progress | None = None) -> Manifest:
    """The manifest of a file, without storing its blocks (a path on a shared filesystem)."""
    check_block_size(block_size)
    digests: list[str] = []
    size = 0
    for _, data in cut(path, block_size):
        digests.append(digest(data))
        size += len(data)
        if progress:
            progress(size, 0, 0)
    if size == 0:
        raise ManifestError(f"{path} is empty")
    return Manifest(size=size, block_size=block_size, blocks=tuple(digests))


def upload_file(
    store: Store,
    path: str,
    block_size: int,
    parallel: int = 8,
    progress: Progress | None = None,
    *,
    keys: SiteKeys | None,
) -> Manifest:
    """Cut ``path`` into blocks, upload each distinct block the store lacks, save the manifest.

    The manifest is written last, so a crash part-way leaves only unreferenced blocks
    (``bootseer image gc`` removes them), never a manifest naming missing blocks.
    """
    check_block_size(block_size)
    if keys is not None:
        keys.require()  # before the upload, not after it
    import os

    total = os.stat(path).st_size
    have = {key_digest(o.key) for o in store.list(BLOCKS, recursive=True)}
    digests: list[str] = []
    done = uploaded = 0
    lock = threading.Lock()
    pending: set[cf.Future[None]] = set()

    def put(d: str, data: bytes) -> None:
        nonlocal uploaded
        store.write_bytes(block_key(d), data)
        with lock:
            uploaded += len(data)

    with cf.ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        for _, data in cut(path, block_size):
            d = digest(data)
            digests.append(d)
            done += len(data)
            if d not in have:
                have.add(d)
                if len(pending) >= 2 * parallel:  # bound the bytes held in memory
                    finished, pending = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                    for f in finished:
                        f.result()
                pending.add(pool.submit(put, d, data))
            if progress:
                progress(done, total, uploaded)
        for f in cf.as_completed(pending):
            f.result()
    if done == 0:
        raise ManifestError(f"{path} is empty")
    manifest = Manifest(size=done, block_size=block_size, blocks=tuple(digests))
    save_manifest(store, manifest, keys=keys)
    if progress:
        progress(done, total, uploaded)
    return manifest
