"""Which image a job means: a registered ``NAME[:TAG]``, or a path on a shared filesystem.

Store layout (all JSON, written atomically)::

    images/names/<name>/<tag>.json    {"image": ID, "size": ..., "added": ...}
    images/paths/<sha256 of path>.json {"path": ..., "size": ..., "mtime_ns": ..., "image": ID}
    images/locks/<...>.lock           held while one node registers a path image

A registered name's blocks are in the store (``bootseer image add``). A path image is
registered on first use: one node (whoever creates the lock) reads the file once and
stores its manifest; the blocks stay in the file, which the agent reads and checks
against the manifest. A changed file (size or mtime) is a new image.

    >>> split_ref("pytorch:24.05"), split_ref("pytorch")
    (('pytorch', '24.05'), ('pytorch', 'latest'))
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pwd
import socket
import stat
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass

from bootseer import jsonlimits, sitekey
from bootseer.asuser import UserChild, UserChildError, user_groups
from bootseer.errors import ManifestError, StoreError
from bootseer.image.manifest import (
    MAX_RECORD_BYTES,
    Manifest,
    Progress,
    hash_file,
    load_manifest,
    save_manifest,
)
from bootseer.jsondecode import decode
from bootseer.options import parse_image
from bootseer.recordcache import RecordCache
from bootseer.sitekey import Purpose, SealError, SiteKeys
from bootseer.store import Store
from bootseer.users import check_user

SQUASHFS_MAGIC = b"hsqs"
STALE_LOCK = 900.0  # a registration lock older than this is a crashed registrar's


class UnknownImage(ManifestError):
    """No image is registered under this name."""


class RegistrationPending(StoreError):
    """Another node is registering this path image and did not finish in time."""


@dataclass(frozen=True)
class NameRecord:
    """``images/names/<name>/<tag>.json``: the image a name stands for."""

    image: str
    size: int = 0
    block_size: int = 0
    added: float = 0.0
    trace_owner: str | None = None  # whose jobs' trace every job of the name prefetches

    def to_json(self) -> dict[str, object]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class PathRecord:
    """``images/paths/<sha256 of path>.json``: the image of this very file (its
    identity: :func:`_identity_of`)."""

    path: str
    image: str
    size: int = 0
    mtime_ns: int = 0
    ino: int = 0
    ctime_ns: int = 0
    block_size: int = 0
    added: float = 0.0

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    def identity(self) -> tuple[str, int, int, int, int]:
        return (self.path, self.size, self.mtime_ns, self.ino, self.ctime_ns)


def split_ref(ref: str) -> tuple[str, str]:
    name, _, tag = ref.partition(":")
    return name, tag or "latest"


def name_key(ref: str) -> str:
    parse_image(ref)  # the option's syntax, so nothing odd reaches a store key
    name, tag = split_ref(ref)
    return f"images/names/{name}/{tag}.json"


def path_key(path: str) -> str:
    return f"images/paths/{hashlib.sha256(path.encode()).hexdigest()}.json"


def tag_image(
    store: Store,
    ref: str,
    manifest: Manifest,
    *,
    keys: SiteKeys | None,
    trace_owner: str | None = None,
) -> None:
    """Seal the name record. ``trace_owner``: the user whose jobs' trace of the image
    every job of the name prefetches first (others' jobs keep traces of their own)."""
    owner = None if trace_owner is None else check_user(trace_owner)
    record = NameRecord(manifest.id, manifest.size, manifest.block_size, time.time(), owner)
    key = name_key(ref)
    body = json.dumps(record.to_json(), separators=(",", ":")).encode()
    store.write_bytes(key, sitekey.seal_with(keys, sitekey.IMAGE_NAME, key, body))


def lookup_name(store: Store, ref: str, *, keys: SiteKeys | None) -> Manifest:
    """The manifest a name's record points at; with ``keys`` (a root-run reader) the
    record and the manifest must both verify (:class:`~bootseer.sitekey.SealError`)."""
    return lookup_name_record(store, ref, keys=keys)[0]


def lookup_name_record(
    store: Store, ref: str, *, keys: SiteKeys | None, records: RecordCache | None = None
) -> tuple[Manifest, str | None]:
    """:func:`lookup_name`, and the record's ``trace_owner`` (None: none set). With
    ``records`` (and ``keys``), the node's copies: the manifest's when it has one, the
    name record's when the store fails or is slow."""
    key = name_key(ref)
    try:
        doc = _record(store, key, sitekey.IMAGE_NAME, keys, records)
        record = decode(NameRecord, doc, key)
        owner = None if record.trace_owner is None else check_user(record.trace_owner)
    except FileNotFoundError:
        raise UnknownImage(
            f"no image named {ref!r} in {store.uri} (see `bootseer image ls`)"
        ) from None
    except ValueError as exc:  # DecodeError, and a bad trace_owner
        raise ManifestError(f"image name record {ref!r} is damaged: {exc}") from None
    return load_manifest(store, record.image, keys=keys, records=records), owner


def list_names(
    store: Store, *, keys: SiteKeys | None = None, limit: int | None = None
) -> list[tuple[str, NameRecord]]:
    """Every name's ``NAME:TAG`` and record: shown, not trusted, without ``keys``; with
    them, only the records that verify (those a job of the name would be served). At
    most ``limit`` names read (None: all)."""
    out: list[tuple[str, NameRecord]] = []
    for obj in store.list("images/names", recursive=True):
        parts = obj.key.split("/")
        if len(parts) != 4 or not parts[3].endswith(".json"):
            continue
        if limit is not None and len(out) >= limit:
            break
        try:
            doc = _record(store, obj.key, sitekey.IMAGE_NAME, keys)
            record = decode(NameRecord, doc, obj.key)
        except (ValueError, FileNotFoundError, SealError):
            continue
        out.append((f"{parts[2]}:{parts[3].removesuffix('.json')}", record))
    return out


def list_paths(store: Store) -> list[PathRecord]:
    out = []
    for obj in store.list("images/paths"):
        try:  # shown, not trusted
            doc = _record(store, obj.key, sitekey.IMAGE_PATH, None)
            out.append(decode(PathRecord, doc, obj.key))
        except (ValueError, FileNotFoundError):
            continue
    return out


def _record(
    store: Store,
    key: str,
    purpose: Purpose,
    keys: SiteKeys | None,
    records: RecordCache | None = None,
) -> object:
    """A name or path record that verifies under ``keys`` (else SealError; None: not
    checked), within its size and depth limits (else ValueError)."""
    limit = MAX_RECORD_BYTES + sitekey.SEAL_BYTES + 1
    if records is not None and keys is not None:
        raw = records.latest(store, key, limit, purpose, keys)
    else:
        raw = store.read_bytes(key, limit=limit)
    raw = sitekey.open_with(keys, purpose, key, raw)
    return jsonlimits.loads(raw, max_bytes=MAX_RECORD_BYTES, what=f"record {key}")


def remove_name(store: Store, ref: str) -> None:
    key = name_key(ref)
    if not store.exists(key):
        raise UnknownImage(f"no image named {ref!r}")
    store.delete(key)


def _path_record(
    store: Store, path: str, st: os.stat_result, keys: SiteKeys | None
) -> Manifest | None:
    """The registered manifest of this very file, or None (then it is registered again:
    a record or manifest that does not verify is replaced, never used)."""
    key = path_key(path)
    try:
        record = decode(PathRecord, _record(store, key, sitekey.IMAGE_PATH, keys), key)
    except (FileNotFoundError, ValueError, SealError):
        return None
    if record.identity() != _identity_of(path, st).identity():
        return None
    try:
        return load_manifest(store, record.image, keys=keys)
    except (ManifestError, SealError):
        return None


def _identity_of(path: str, st: os.stat_result, image: str = "") -> PathRecord:
    """What makes a path record name this very file, not one that had its name, size and
    mtime before (a user sets her own file's mtime; a node-local path names another
    file on each node; an inode number is reused once freed): its inode number and its
    ctime, which no user can set and any change of the file or its metadata moves. Not
    the device: a shared filesystem's file has one inode and ctime on every node, but
    its device number differs between nodes."""
    return PathRecord(path, image, st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


class RegistrationLock:
    """One object in the store that says a node is registering an image file.

    Whoever creates it registers; the others wait for the path record. Its body names
    the holder and a random token, so a holder knows its own lock (on S3, where the
    last of several writers wins, by reading back its token) and an admin sees who
    held a stale one. A lock older than ``STALE_LOCK`` is a crashed holder's.
    """

    def __init__(self, store: Store, key: str) -> None:
        self.store = store
        self.key = key

    def acquire(self) -> bool:
        holder = {
            "host": os.uname().nodename,
            "pid": os.getpid(),
            "at": time.time(),
            "token": uuid.uuid4().hex,
        }
        return self.store.create_exclusive(self.key, json.dumps(holder).encode())

    def release(self) -> None:
        self.store.delete(self.key)

    def stale(self) -> bool:
        info = self.store.info(self.key)
        return info is not None and bool(info.mtime) and time.time() - info.mtime > STALE_LOCK


def register_path(
    store: Store,
    path: str,
    st: os.stat_result,
    block_size: int,
    wait: float,
    log: Callable[[str], None] = lambda _: None,
    read_from: str | None = None,
    *,
    keys: SiteKeys | None,
    progress: Progress | None = None,
) -> Manifest:
    """The manifest of the image file at ``path``, registering it if no node has yet.

    Many nodes may ask at once: the one that creates the lock hashes the file (from
    ``read_from`` if given: the checked descriptor's ``/proc/self/fd/N``); the others
    poll for the record for up to ``wait`` seconds, then raise
    :class:`RegistrationPending` (the job then reads the file directly). ``progress``
    is called as the file is hashed; what it raises stops the hashing.
    """
    if keys is not None:
        keys.require()  # a record it could not seal would be refused by every node
    found = _path_record(store, path, st, keys)
    if found is not None:
        return found
    lock = RegistrationLock(
        store, f"images/locks/path-{path_key(path).rsplit('/', 1)[1][:-5]}-{st.st_mtime_ns}.lock"
    )
    until = time.monotonic() + wait
    while True:
        if lock.acquire():
            try:
                found = _path_record(store, path, st, keys)  # done by whoever held the lock before
                if found is not None:
                    return found
                log(f"registering {path} ({st.st_size} bytes)")
                t0 = time.monotonic()
                manifest = hash_file(read_from or path, block_size, progress)
                save_manifest(store, manifest, keys=keys)
                record = dataclasses.replace(
                    _identity_of(path, st, manifest.id), block_size=block_size, added=time.time()
                )
                key = path_key(path)
                body = json.dumps(record.to_json(), separators=(",", ":")).encode()
                store.write_bytes(key, sitekey.seal_with(keys, sitekey.IMAGE_PATH, key, body))
                log(f"registered {path} as {manifest.id[:12]} in {time.monotonic() - t0:.1f}s")
                return manifest
            finally:
                lock.release()
        found = _path_record(store, path, st, keys)
        if found is not None:
            return found
        if lock.stale():
            log(f"breaking stale registration lock {lock.key}")
            lock.release()
            continue
        if time.monotonic() >= until:
            raise RegistrationPending(f"{path} is being registered by another node")
        time.sleep(min(0.2, max(0.0, until - time.monotonic())))


def check_image_file(path: str, uid: int, gid: int) -> os.stat_result:
    """Stat of the squashfs image at ``path`` if the job's user may read it; else StoreError."""
    fd, st = open_image_file(path, uid, gid)
    os.close(fd)
    return st


OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
OPEN_TIMEOUT = 30.0  # seconds for the user's child to open the file (a slow shared fs)


def _open_checked(path: str) -> tuple[int, str]:
    """Open the image at ``path`` with this process's rights: (descriptor, real path).

    ``O_NONBLOCK`` so a FIFO or device cannot hold the caller, ``O_NOFOLLOW`` on the
    resolved path so the last component cannot become a link after it was resolved.
    """
    real = os.path.realpath(path)
    try:
        fd = os.open(real, OPEN_FLAGS)
    except FileNotFoundError:
        raise StoreError(f"image {path} does not exist") from None
    except PermissionError as exc:
        raise _unreadable(path, os.geteuid(), exc) from None
    except OSError as exc:
        raise StoreError(f"cannot open image {path}: {exc.strerror}") from None
    try:
        _check_open(path, fd)
    except BaseException:
        os.close(fd)
        raise
    return fd, real


def _unreadable(path: str, uid: int, exc: OSError) -> StoreError:
    return StoreError(
        f"image {path} is not readable by uid {uid} (the file, or a directory on its path "
        f"that is not searchable: {exc.strerror})"
    )


def _check_open(path: str, fd: int) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise StoreError(f"image {path} is not a regular file")
    if os.pread(fd, 4, 0) != SQUASHFS_MAGIC:
        raise StoreError(f"image {path} is not a squashfs file (no 'hsqs' magic)")
    return st


def _groups(uid: int, gid: int) -> list[int]:
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return [gid]
    return user_groups(name, gid)


def open_image_file(
    path: str, uid: int, gid: int, timeout: float = OPEN_TIMEOUT
) -> tuple[int, os.stat_result]:
    """An open descriptor and stat of the squashfs image at ``path``, opened by the job's
    user; else StoreError.

    The caller runs as root, but the file is opened in a child that has become the
    job's user (:class:`~bootseer.asuser.UserChild`), so the kernel checks every
    directory and the file itself at the moment of the open, as that user: no check
    before the open that a swapped directory or link could outrun. The child hands the
    descriptor back over a socket (``SCM_RIGHTS``); only regular files, opened
    non-blocking, pass. Read the image through this descriptor (``pread``, or
    ``/proc/self/fd/N``), never by ``path`` again.
    """
    if uid == 0 or uid == os.geteuid():
        fd, _ = _open_checked(path)
        return fd, os.fstat(fd)
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)

    def work(_in: int | None, _out: int | None) -> str:
        fd, real = _open_checked(path)
        socket.send_fds(child_end, [b"fd"], [fd])
        os.close(fd)
        return real

    try:
        child = UserChild.start(uid, gid, work, groups=_groups(uid, gid))
        child_end.close()
        try:
            child.result(timeout)
        except UserChildError as exc:
            raise StoreError(str(exc)) from None
        parent_end.setblocking(False)
        try:
            _, fds, _, _ = socket.recv_fds(parent_end, 16, 1)
        except BlockingIOError:
            raise StoreError(f"image {path}: the opening child sent no descriptor") from None
    finally:
        child_end.close()
        parent_end.close()
    if len(fds) != 1:
        for extra in fds:
            os.close(extra)
        raise StoreError(f"image {path}: the opening child sent {len(fds)} descriptors")
    fd = fds[0]
    try:
        st = _check_open(path, fd)  # again, in the parent: trust the descriptor, not the child
    except BaseException:
        os.close(fd)
        raise
    return fd, st
