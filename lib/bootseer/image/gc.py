"""Garbage collection of the image store: what no name and no path record reaches.

Objects younger than ``grace`` seconds are kept, so an ``image add`` in progress (its
blocks go up before its manifest) loses nothing. A manifest that is kept but cannot be
read (a store error, damage, or a format this release does not know: a newer release
wrote it) names blocks gc cannot see, so then no block is deleted at all. A trace's
bundles (:mod:`bootseer.image.bundles`) go with their image, and once no trace of it names
them; an image whose traces cannot all be read keeps all its bundles::

    >>> collect(store, grace=3600, dry_run=True).blocks  # doctest: +SKIP
    0
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from bootseer.errors import StoreError, describe
from bootseer.image.blocks import BLOCKS, key_digest
from bootseer.image.bundles import BUNDLES
from bootseer.image.manifest import Manifest, load_manifest
from bootseer.image.registry import list_names, list_paths
from bootseer.image.trace import load_trace
from bootseer.store import ObjectInfo, Store
from bootseer.users import is_user_name


@dataclass
class GcReport:
    manifests: int = 0
    traces: int = 0
    bundles: int = 0
    bundle_bytes: int = 0
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
    kept: dict[str, Manifest] = {}
    for obj in store.list("images/manifests"):
        image_id = obj.key.rsplit("/", 1)[1].removesuffix(".json")
        if image_id in live or now - obj.mtime < grace:
            try:
                kept[image_id] = load_manifest(store, image_id, keys=None)
                keep_blocks.update(kept[image_id].blocks)
            except StoreError as exc:
                report.unreadable.append((image_id, describe(exc)))
            continue
        report.manifests += 1
        if not dry_run:
            store.delete(obj.key)
    # images/traces/<id>/<user>.json, <id>/bundles/<bundle id>, and <id>.json from before
    # traces were per user
    objects = store.list("images/traces", recursive=True)
    named = _named_bundles(store, kept, objects)
    for obj in objects:
        parts = obj.key.split("/")
        image_id = parts[2].removesuffix(".json")
        gone = image_id not in live and now - obj.mtime >= grace
        if len(parts) == 5 and parts[3] == BUNDLES:
            if gone or (
                image_id in named and parts[4] not in named[image_id] and now - obj.mtime >= grace
            ):
                report.bundles += 1
                report.bundle_bytes += obj.size
                if not dry_run:
                    store.delete(obj.key)
            continue
        if len(parts) == 3 or gone:
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


def _named_bundles(
    store: Store, kept: dict[str, Manifest], objects: list[ObjectInfo]
) -> dict[str, set[str | None]]:
    """The bundles each kept image's traces name; an image with a trace that cannot be
    read is left out (all its bundles are kept)."""
    named: dict[str, set[str | None]] = {i: set() for i in kept}
    for obj in objects:
        parts = obj.key.split("/")
        image_id = parts[2]
        if len(parts) != 4 or image_id not in named or not parts[3].endswith(".json"):
            continue
        user = parts[3].removesuffix(".json")
        if not is_user_name(user):
            continue  # no trace of a user's jobs
        problems: list[str] = []
        t = load_trace(store, kept[image_id], problems.append, keys=None, user=user)
        if t is None and problems:
            del named[image_id]
        elif t is not None:
            named[image_id].update(t.bundles)
    return named
