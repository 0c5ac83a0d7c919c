"""Listing snapshots and collecting old ones: by age, by last use, by total size.

A snapshot's last use is the newest of its capture and its ``used`` mark (written
by the first node of each job that restored it). gc removes, in this order:
snapshots older than ``max_age``, snapshots unused for ``unused``, then the least
recently used until the total fits ``max_total``. It also sweeps archives no
manifest names (a capture that lost a race, or died before its manifest) once they
are older than ``grace``, and refs whose snapshot is gone.

    >>> plan_gc([], now=0, max_age=None, unused=None, max_total=None)
    []
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bootseer import jsonlimits
from bootseer.deps.layout import ROOT, SnapshotPaths, is_data_name, is_key, ref_path
from bootseer.deps.manifest import MAX_MANIFEST
from bootseer.deps.restore import MAX_REF
from bootseer.store import Store


@dataclass(frozen=True)
class SnapshotInfo:
    scope: str
    key: str
    size: int  # bytes in the store
    created: float
    last_used: float


def all_scopes(store: Store) -> list[str]:
    out = []
    for kind in store.list_dirs(ROOT):
        if kind == "cluster":
            out.append("cluster")
        elif kind in ("user", "account"):
            out.extend(f"{kind}/{name}" for name in store.list_dirs(f"{ROOT}/{kind}"))
    return out


def list_snapshots(store: Store, scopes: list[str]) -> list[SnapshotInfo]:
    out = []
    for scope in scopes:
        by_key: dict[str, dict[str, float]] = {}
        for obj in store.list(f"{ROOT}/{scope}", recursive=True):
            parts = obj.key.split("/")
            key, name = parts[-2], parts[-1]
            if not is_key(key):
                continue
            d = by_key.setdefault(key, {"size": 0, "created": 0.0, "used": 0.0, "complete": 0})
            if name == "manifest.json":
                d["created"] = obj.mtime
                d["complete"] = 1
                d["size"] += obj.size
            elif is_data_name(name):
                d["size"] += obj.size
            elif name == "used":
                d["used"] = _used(store, obj.key, obj.mtime)
        for key, d in sorted(by_key.items()):
            if d["complete"]:
                out.append(
                    SnapshotInfo(
                        scope, key, int(d["size"]), d["created"], max(d["created"], d["used"])
                    )
                )
    return out


def _used(store: Store, key: str, fallback: float) -> float:
    try:
        return float(store.read_bytes(key).decode())
    except (ValueError, OSError, FileNotFoundError):
        return fallback


def plan_gc(
    snapshots: list[SnapshotInfo],
    *,
    now: float,
    max_age: float | None,
    unused: float | None,
    max_total: int | None,
) -> list[SnapshotInfo]:
    """Which snapshots to remove (seconds for ages, bytes for the total)."""
    doomed: dict[tuple[str, str], SnapshotInfo] = {}
    for s in snapshots:
        if (max_age is not None and now - s.created > max_age) or (
            unused is not None and now - s.last_used > unused
        ):
            doomed[(s.scope, s.key)] = s
    if max_total is not None:
        kept = sorted(
            (s for s in snapshots if (s.scope, s.key) not in doomed), key=lambda s: s.last_used
        )
        total = sum(s.size for s in kept)
        for s in kept:
            if total <= max_total:
                break
            doomed[(s.scope, s.key)] = s
            total -= s.size
    return sorted(doomed.values(), key=lambda s: s.last_used)


def _doc(store: Store, key: str, limit: int) -> Any:
    """A ref or manifest, within its size and depth limits (else ValueError)."""
    return jsonlimits.loads(store.read_bytes(key, limit=limit + 1), max_bytes=limit, what=key)


def remove_snapshot(store: Store, scope: str, key: str) -> None:
    """Manifest first, so a half-removed snapshot is never restored."""
    paths = SnapshotPaths(scope, key)
    store.delete(paths.manifest)
    store.delete_prefix(paths.dir)
    for obj in store.list(f"{ROOT}/{scope}/refs"):
        try:
            if _doc(store, obj.key, MAX_REF).get("key") == key:
                store.delete(obj.key)
        except (ValueError, FileNotFoundError, AttributeError):
            continue


def sweep(store: Store, scope: str, *, now: float, grace: float) -> list[str]:
    """Remove archives no manifest names and refs to missing snapshots; returns keys removed."""
    removed = []
    manifests: dict[str, str | None] = {}
    for obj in store.list(f"{ROOT}/{scope}", recursive=True):
        parts = obj.key.split("/")
        key, name = parts[-2], parts[-1]
        if not is_key(key) or not is_data_name(name) or now - obj.mtime < grace:
            continue
        if key not in manifests:
            try:
                manifests[key] = _doc(store, SnapshotPaths(scope, key).manifest, MAX_MANIFEST)[
                    "data"
                ]
            except (FileNotFoundError, ValueError, KeyError, TypeError):
                manifests[key] = None
        if manifests[key] != name:
            store.delete(obj.key)
            removed.append(obj.key)
    for obj in store.list(f"{ROOT}/{scope}/refs"):
        base = obj.key.rsplit("/", 1)[-1].removesuffix(".json")
        if now - obj.mtime < grace or not is_key(base):
            continue
        try:
            key = _doc(store, obj.key, MAX_REF)["key"]
            gone = not is_key(key) or not store.exists(SnapshotPaths(scope, key).manifest)
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            gone = True
        if gone:
            store.delete(ref_path(scope, base))
            removed.append(obj.key)
    return removed
