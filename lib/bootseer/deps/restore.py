"""Restore: a snapshot from the store into a node-local prefix, whole or not at all.

This process fetches the archive's frames, verifies each against the manifest's
checksum and decodes them on several threads; a child with the job user's rights
extracts the stream into a sibling of the prefix and renames it into place
(:func:`bootseer.deps.archive.extract_snapshot`). The files therefore belong to the
job's user, and a hostile archive can reach at most what that user could.

    >>> from bootseer.store import open_store
    >>> store = open_store("file:///tmp/doc-deps-store")
    >>> find_snapshot(store, "user/nobody-here", "0" * 32, keys=None) is None
    True
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bootseer import jsonlimits, sitekey
from bootseer.asuser import UserChild, UserChildError
from bootseer.deps import archive, gnutar
from bootseer.deps.frames import decode_frames, restore_threads
from bootseer.deps.layout import SnapshotPaths, is_key, ref_path
from bootseer.deps.manifest import MAX_FRAME_BYTES, MAX_MANIFEST, Manifest
from bootseer.errors import ManifestError, StepError, StoreError
from bootseer.recordcache import RecordCache
from bootseer.sitekey import SiteKeys
from bootseer.store import Store

MAX_REF = 64 << 10
# After the deadline, the time the extracting child (terminated then, killed 5 s later)
# has to remove its temporary directory before restore returns.
UNWIND_SECONDS = 10.0


class RestoreError(StepError):
    """A restore failed; the prefix was left as it was."""


@dataclass
class RestoreRequest:
    prefix: str
    uid: int
    gid: int
    groups: Sequence[int] | None = None
    link_roots: Sequence[str] = ("/usr", "/opt")
    max_bytes: int = 64 << 30
    max_files: int = 1_000_000
    max_frame_bytes: int = MAX_FRAME_BYTES
    threads: int = 0
    timeout: float = 600.0
    replace: bool = False  # the prefix is a restore of ours: swap it for the new one
    extractor: archive.Extractor = "tar"  # GNU tar fed checked headers; "python": tarfile


@dataclass
class Restored:
    key: str
    fetched: int  # bytes read from the store (manifest and archive)
    peer_bytes: int  # archive bytes that came from the job's other nodes
    entries: int
    bytes: int  # of file contents written
    dev: int
    ino: int


def find_snapshot(
    store: Store,
    scope: str,
    base: str,
    *,
    keys: SiteKeys | None,
    records: RecordCache | None = None,
) -> str | None:
    """The snapshot key the base key's ref points at, or None; with ``keys`` (a root-run
    reader), :class:`~bootseer.sitekey.SealError` unless the ref verifies. With
    ``records`` too, the node's copy of the ref serves when the store fails or is slow."""
    path = ref_path(scope, base)
    limit = MAX_REF + sitekey.SEAL_BYTES + 1
    try:
        if records is not None and keys is not None:
            raw = records.latest(store, path, limit, sitekey.DEPS_REF, keys)
        else:
            raw = store.read_bytes(path, limit=limit)
    except FileNotFoundError:
        return None
    raw = sitekey.open_with(keys, sitekey.DEPS_REF, path, raw)
    try:
        key = jsonlimits.loads(raw, max_bytes=MAX_REF, what="ref")["key"]
    except (ValueError, KeyError, TypeError):
        raise ManifestError(f"ref {ref_path(scope, base)} is not valid JSON") from None
    if not isinstance(key, str) or not is_key(key):
        raise ManifestError(f"ref {ref_path(scope, base)} names no valid key")
    return key


def read_manifest(
    store: Store,
    scope: str,
    key: str,
    *,
    max_bytes: int,
    max_files: int,
    max_frame_bytes: int = MAX_FRAME_BYTES,
    keys: SiteKeys | None,
    records: RecordCache | None = None,
) -> tuple[Manifest, int] | None:
    """The manifest of a snapshot and the bytes read from the store for it (0: the
    node's copy in ``records``), or None if there is none; with ``keys`` (a root-run
    reader), :class:`~bootseer.sitekey.SealError` unless it verifies. None is for a
    user's own ``deps run``/``deps show``, which trust nothing in it that the user could
    not have written."""
    path = SnapshotPaths(scope, key).manifest
    limit = MAX_MANIFEST + sitekey.SEAL_BYTES + 1
    try:
        if records is not None and keys is not None:
            held = records.held(path, sitekey.DEPS_MANIFEST, keys)
            raw = held or records.fixed(store, path, limit, sitekey.DEPS_MANIFEST, keys)
        else:
            held, raw = None, store.read_bytes(path, limit=limit)
    except FileNotFoundError:
        return None
    size = 0 if held is not None else len(raw)
    raw = sitekey.open_with(keys, sitekey.DEPS_MANIFEST, path, raw)
    m = Manifest.from_json(
        raw, max_bytes=max_bytes, max_files=max_files, max_frame_bytes=max_frame_bytes
    )
    if m.key != key or m.scope != scope:
        raise ManifestError(f"manifest at {scope}/{key} claims to be {m.scope}/{m.key}")
    return m, size


def drop_snapshot(
    store: Store,
    scope: str,
    base: str,
    key: str,
    broken: Manifest | None,
    *,
    max_bytes: int,
    max_files: int,
    max_frame_bytes: int = MAX_FRAME_BYTES,
    keys: SiteKeys | None,
) -> None:
    """Remove a snapshot found broken, so the job's install is captured anew in its place
    instead of the broken one being restored again by every later job.

    ``broken`` is the manifest whose archive failed (None: the manifest itself or the ref
    did). Only what is still broken goes: a manifest a capture has replaced meanwhile
    (it names another archive, or parses now) stays, and so does a ref naming another key.
    """
    paths = SnapshotPaths(scope, key)
    try:
        current = read_manifest(
            store,
            scope,
            key,
            max_bytes=max_bytes,
            max_files=max_files,
            max_frame_bytes=max_frame_bytes,
            keys=keys,
        )
    except ManifestError:
        current = None
        manifest_broken = True
    else:
        manifest_broken = (
            current is not None and broken is not None and current[0].data == broken.data
        )
    if manifest_broken:
        store.delete(paths.manifest)
        if broken is not None:
            store.delete(paths.data(broken.data))
    try:
        pointed = find_snapshot(store, scope, base, keys=keys)
    except ManifestError:
        pointed = key  # a ref that does not parse goes too
    if pointed == key and (manifest_broken or current is None):
        store.delete(ref_path(scope, base))


# (store key, offset, length, digest) -> (the frame's bytes, "peer"/"store"/"cache"), or
# None: read it from the store here. The prolog's way to the job's peers (the agent).
FrameVia = Callable[[str, int, int, str], tuple[bytes, str] | None]


def restore(
    store: Store,
    manifest: Manifest,
    req: RestoreRequest,
    progress: Callable[[int], None] | None = None,
    via: FrameVia | None = None,
) -> Restored:
    """Fetch, verify, decode and extract ``manifest``'s snapshot into ``req.prefix``;
    with ``via``, frames come through the job's peers where they can. Ends by
    ``req.timeout`` (and the child's unwinding): a fetch that hangs is left behind."""
    deadline = time.monotonic() + req.timeout
    if manifest.prefix != req.prefix.rstrip("/"):
        raise RestoreError(
            f"snapshot {manifest.key} was captured from {manifest.prefix}, not {req.prefix}"
        )
    data_key = SnapshotPaths(manifest.scope, manifest.key).data(manifest.data)
    # The archive in the store, opened (and its size held against the manifest) before
    # the first byte read from it: before anything without ``via``; with it, only if a
    # frame does not come through it (every frame that does was checked by its digest),
    # so a hung store costs a restore nothing the job's nodes hold.
    opened: list[Any] = []  # a pyarrow file (Store.open_read)
    src_lock = threading.Lock()

    def stored() -> Any:
        with src_lock:
            if opened:
                return opened[0]
            try:
                src = store.open_read(data_key)
                size = src.size()
            except FileNotFoundError:
                raise RestoreError(
                    f"snapshot {manifest.key}: archive {manifest.data} is missing"
                ) from None
            if size != manifest.stored_bytes:
                src.close()
                raise ManifestError(
                    f"snapshot {manifest.key}: archive has {size} bytes, the manifest "
                    f"says {manifest.stored_bytes} (truncated or replaced)"
                )
            opened.append(src)
            return src

    if via is None:
        stored()
    fetched = peer_bytes = 0
    lock = threading.Lock()
    digest_at = {f.offset: f.digest for f in manifest.frames}

    def fetch(offset: int, length: int) -> bytes:
        nonlocal fetched, peer_bytes
        got = via(data_key, offset, length, digest_at[offset]) if via is not None else None
        if got is None:
            got = bytes(stored().read_at(length, offset)), "store"
        data, source = got
        with lock:
            if source == "store":
                fetched += len(data)
            elif source == "peer":
                peer_bytes += len(data)
        return data

    entries, prefix, raw_bytes = manifest.entries, req.prefix, manifest.raw_bytes
    replace, mode = req.replace, manifest.mode

    def work(in_fd: int | None, _out: int | None) -> object:
        assert in_fd is not None
        return archive.extract_snapshot(
            in_fd,
            prefix,
            entries,
            raw_bytes=raw_bytes,
            link_roots=list(req.link_roots),
            max_bytes=req.max_bytes,
            max_files=req.max_files,
            replace=replace,
            mode=mode,
            extractor=req.extractor,
        )

    if req.extractor == "tar":
        gnutar.gnu_tar()  # found once per process, not in every child (it runs `tar --version`)
    child = UserChild.start(req.uid, req.gid, work, groups=req.groups, feed=True)
    assert child.stdin is not None
    _widen_pipe(child.stdin)
    guard = threading.Lock()
    armed = True

    def stop_at_deadline() -> None:
        # terminate, not kill: the child removes its temporary directory as it unwinds
        with guard:
            if armed:
                child.terminate()

    watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), stop_at_deadline)
    watchdog.daemon = True
    watchdog.start()
    failure: BaseException | None = None
    whole = False
    try:
        for chunk in decode_frames(
            fetch,
            manifest.frames,
            threads=restore_threads(req.threads),
            progress=progress,
            max_raw=req.max_frame_bytes,
            deadline=deadline,
        ):
            if not _write_all(child.stdin, chunk):
                break  # the child gave up; its answer says why
        else:
            whole = True
    except (ManifestError, StoreError, OSError) as exc:
        failure = exc
    finally:
        if not whole:
            # The stream ends short and the child unwinds on its own: the deadline's stop
            # (due at the same moment when the frames ran out of time) must not land in
            # its cleanup and leave the temporary directory.
            with guard:
                armed = False
        # Closing the stream (rather than killing the child) lets it clean up its temp dir.
        child.close_stdin()
        try:
            left = max(0.0, deadline - time.monotonic())
            answer = child.result(timeout=left + UNWIND_SECONDS)
        except UserChildError as exc:
            if failure is None:
                failure = RestoreError(f"extracting into {req.prefix} as uid {req.uid}: {exc}")
        finally:
            watchdog.cancel()
            for src in opened:
                src.close()
    if failure is not None:
        if isinstance(failure, StepError | StoreError):
            raise failure
        raise RestoreError(f"restore of {manifest.key}: {failure}") from failure
    return Restored(
        manifest.key,
        fetched,
        peer_bytes,
        int(answer["entries"]),
        int(answer["bytes"]),
        int(answer["dev"]),
        int(answer["ino"]),
    )


def _widen_pipe(fd: int) -> None:
    # Frames arrive 8 MiB at a time; a 64 KiB pipe wakes the extracting child
    # (and this process) once per 64 KiB. 1 MiB is the default unprivileged limit.
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)


def _write_all(fd: int, data: bytes) -> bool:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except BrokenPipeError:
        return False
    return True
