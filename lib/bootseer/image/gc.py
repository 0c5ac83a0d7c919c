"""Garbage collection of the image store: what no name and no path record reaches.

Objects younger than ``grace`` seconds are kept, so an ``image add`` in progress (its
blocks go up before its manifest) loses nothing. A manifest that is kept but cannot be
read (a store error, damage, or a format this release does not know: a newer release
wrote it) names blocks gc cannot see, so then no block is deleted at all::

    >>> collect(store, grace=3600, dry_run=True).blocks  # doctest: +SKIP
    0
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from bootseer.errors import StoreError, describe
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
    # (image id, why) of kept manifests that could not be read: no block was deleted
    unreadable: list[tuple[str, str]] = field(default_factory=list)


def collect(store: Store, grace: float = 3600.0, dry_run: bool = False) -> GcReport:
    now = time.time()
    live = {record.image for _, record in list_names(store)}
    live |= {record.image for record in list_paths(store)}
    report = GcReport()
    keep_blocks: set[str] = set()
    for obj in store.list("images/manifests"):
        image_id = obj.key.rsplit("/", 1)[1].removesuffix(".json")
        if image_id in live or now - obj.mtime < grace:
            try:
                keep_blocks.update(load_manifest(store, image_id, keys=None).blocks)
            except StoreError as exc:
                report.unreadable.append((image_id, describe(exc)))
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
        if report.unreadable or key_digest(obj.key) in keep_blocks or now - obj.mtime < grace:
            report.kept_blocks += 1
            continue
        report.blocks += 1
        report.bytes += obj.size
        if not dry_run:
            store.delete(obj.key)
    return report
