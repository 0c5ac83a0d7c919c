"""Capture: what an install put under a prefix, as a snapshot in the store.

A child with the job user's rights walks the prefix and writes a tar stream (so a
capture can never read what the user could not); this process cuts it into zstd
frames on several threads and uploads them as one archive object, then the manifest,
then the ref from the base key. Each upload is atomic (:meth:`Store.writer`), and
the manifest is the commit point: until it lands nothing is visible, and if two
jobs capture the same key at once, the last manifest wins and names a whole archive.

    >>> from bootseer.store import open_store
    >>> store = open_store("file:///tmp/doc-deps-store")
    >>> import os; os.makedirs("/tmp/doc-prefix/bin", exist_ok=True)
    >>> m = capture(store, CaptureRequest(prefix="/tmp/doc-prefix", scope="user/ada",
    ...     base="1" * 32, key="2" * 32, uid=os.getuid(), gid=os.getgid()), keys=None)
    >>> [e.name for e in m.entries]
    ['bin']
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bootseer import sitekey
from bootseer.asuser import UserChild, UserChildError
from bootseer.deps import archive
from bootseer.deps.frames import default_threads, encode_stream
from bootseer.deps.layout import SnapshotPaths, new_data_name, ref_path
from bootseer.deps.manifest import Entry, Manifest
from bootseer.errors import QuotaExceeded, StepError
from bootseer.sitekey import SealError, SiteKeys
from bootseer.store import Store


class CaptureError(StepError):
    """A capture failed; nothing was published."""


class SnapshotQuotaExceeded(QuotaExceeded, CaptureError):
    """The capture would take its scope past its quota (``deps.quota``,
    :mod:`bootseer.deps.quota`); nothing was published."""


@dataclass
class CaptureRequest:
    prefix: str
    scope: str
    base: str
    key: str
    uid: int
    gid: int
    groups: Sequence[int] | None = None
    names: Sequence[str] | None = None  # what the install added or changed; None: all
    command: list[str] | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    user: str = ""
    job_id: int = 0
    node: str = ""
    frame_bytes: int = 8 << 20
    level: int = 3
    threads: int = 0
    max_bytes: int = 64 << 30
    max_files: int = 1_000_000
    timeout: float = 3600.0
    max_stored: int | None = None  # stored bytes the scope's quota leaves; None: no quota
    quota_note: str = ""  # what the quota is, for the SnapshotQuotaExceeded message


def snapshot_exists(store: Store, scope: str, key: str, *, keys: SiteKeys | None) -> bool:
    """Whether the store holds the snapshot; with ``keys``, only one whose manifest
    verifies counts (a planted one is captured over, not kept)."""
    path = SnapshotPaths(scope, key).manifest
    if keys is None:
        return store.exists(path)
    try:
        keys.open(sitekey.DEPS_MANIFEST, path, store.read_bytes(path))
    except (FileNotFoundError, SealError):
        return False
    return True


def capture(
    store: Store,
    req: CaptureRequest,
    progress: Callable[[int, int], None] | None = None,
    *,
    keys: SiteKeys | None,
) -> Manifest:
    """Upload a snapshot of ``req.prefix`` under ``req.key``; return its manifest.

    ``progress(raw_bytes, stored_bytes)`` is called as frames are uploaded. The manifest
    and ref are sealed with ``keys`` (None: a user's capture, which no root-run part
    will restore).
    """
    if keys is not None:
        keys.require()  # before the upload, not after it
    paths = SnapshotPaths(req.scope, req.key)
    data_name = new_data_name()
    names = list(req.names) if req.names is not None else None
    prefix = req.prefix
    child = UserChild.start(
        req.uid,
        req.gid,
        lambda _i, o: archive.write_snapshot(_fd(o), prefix, names),
        groups=req.groups,
        drain=True,
    )
    assert child.stdout is not None
    out_fd = child.stdout
    stored = 0

    def readinto(buf: memoryview) -> int:
        return os.readv(out_fd, [buf])

    def count(raw: int, done: int) -> None:
        nonlocal stored
        stored = done
        if raw > req.max_bytes:
            raise CaptureError(f"{prefix}: more than deps.max_bytes={req.max_bytes} bytes")
        if req.max_stored is not None and done > req.max_stored:
            raise SnapshotQuotaExceeded(
                f"{prefix}: more than the {req.max_stored} stored bytes left in "
                f"{req.quota_note or 'the scope'}"
            )
        if progress:
            progress(raw, done)

    try:
        with store.writer(paths.data(data_name)) as out:
            frames = encode_stream(
                readinto,
                out.write,
                frame_bytes=req.frame_bytes,
                level=req.level,
                threads=default_threads(req.threads),
                progress=count,
            )
            answer = child.result(timeout=req.timeout)
    except UserChildError as exc:
        raise CaptureError(f"capture of {prefix} as uid {req.uid}: {exc}") from None
    except BaseException:
        child.kill()
        with contextlib.suppress(UserChildError):
            child.result(timeout=5)
        raise
    entries = [Entry(str(n), str(t), int(s), str(link)) for n, t, s, link in answer["entries"]]
    if len(entries) > req.max_files:
        store.delete(paths.data(data_name))
        raise CaptureError(f"{prefix}: {len(entries)} entries, more than deps.max_files")
    manifest = Manifest(
        key=req.key,
        base=req.base,
        scope=req.scope,
        prefix=prefix.rstrip("/"),
        data=data_name,
        frames=frames,
        entries=entries,
        command=req.command,
        inputs=req.inputs,
        created=time.time(),
        user=req.user,
        job_id=req.job_id,
        node=req.node,
        skipped=[str(s) for s in answer["skipped"]],
        mode=int(answer.get("mode", 0o755)),
    )
    try:
        body = sitekey.seal_with(keys, sitekey.DEPS_MANIFEST, paths.manifest, manifest.to_json())
        store.write_bytes(paths.manifest, body)
    except BaseException:
        store.delete(paths.data(data_name))
        raise
    write_ref(store, req.scope, req.base, req.key, req.command, keys=keys)
    return manifest


def write_ref(
    store: Store,
    scope: str,
    base: str,
    key: str,
    command: list[str] | None,
    *,
    keys: SiteKeys | None,
) -> None:
    """Point the base key at the snapshot the prolog should restore for it."""
    ref = {"key": key, "command": command, "created": time.time()}
    path = ref_path(scope, base)
    body = json.dumps(ref, separators=(",", ":")).encode()
    store.write_bytes(path, sitekey.seal_with(keys, sitekey.DEPS_REF, path, body))


def _fd(fd: int | None) -> int:
    assert fd is not None
    return fd
