"""Garbage collection of the image store: what no name and no path record reaches.

Objects younger than ``grace`` seconds are kept, so an ``image add`` in progress (its
blocks go up before its manifest) loses nothing::

    >>> collect(store, grace=3600, dry_run=True).blocks  # doctest: +SKIP
    0
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from bootseer.errors import StoreError
from bootseer.image.blocks import BLOCKS, key_digest
from bootseer.image.manifest import load_manifest
from bootseer.image.registry import list_names, list_paths
from bootseer.store import Store


@dataclass
class GcReport:
    manifests: int = 0
    traces: int = 0
    blocks: int = 0
    bytes: int = 0
    kept_blocks: int = 0


def collect(store: Store, grace: float = 3600.0, dry_run: bool = False) -> GcReport:
    now = time.time()
    live = {record.image for _, record in list_names(store)}
    live |= {record.image for record in list_paths(store)}
    report = GcReport()
    keep_blocks: set[str] = set()
    for obj in store.list("images/manifests"):
        image_id = obj.key.rsplit("/", 1)[1].removesuffix(".json")
        if image_id in live or now - obj.mtime < grace:
            with contextlib.suppress(StoreError):
                keep_blocks.update(load_manifest(store, image_id, keys=None).blocks)
            continue
        report.manifests += 1
        if not dry_run:
            store.delete(obj.key)
    # images/traces/<id>/<user>.json, and <id>.json from before traces were per user
    for obj in store.list("images/traces", recursive=True):
        parts = obj.key.split("/")
        image_id = parts[2].removesuffix(".json")
        if len(parts) == 3 or (image_id not in live and now - obj.mtime >= grace):
            report.traces += 1
            if not dry_run:
                store.delete(obj.key)
    for obj in store.list(BLOCKS, recursive=True):
        if key_digest(obj.key) in keep_blocks or now - obj.mtime < grace:
            report.kept_blocks += 1
            continue
        report.blocks += 1
        report.bytes += obj.size
        if not dry_run:
            store.delete(obj.key)
    return report
