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

import hashlib
import json
import os
import stat
import time
import uuid
from collections.abc import Callable
from typing import Any

from bootseer.errors import StoreError
from bootseer.image.manifest import (
    Manifest,
    ManifestError,
    hash_file,
    load_manifest,
    save_manifest,
)
from bootseer.options import parse_image
from bootseer.store import Store

SQUASHFS_MAGIC = b"hsqs"
STALE_LOCK = 900.0  # a registration lock older than this is a crashed registrar's


class UnknownImage(ManifestError):
    """No image is registered under this name."""


class RegistrationPending(StoreError):
    """Another node is registering this path image and did not finish in time."""


def split_ref(ref: str) -> tuple[str, str]:
    name, _, tag = ref.partition(":")
    return name, tag or "latest"


def name_key(ref: str) -> str:
    parse_image(ref)  # the option's syntax, so nothing odd reaches a store key
    name, tag = split_ref(ref)
    return f"images/names/{name}/{tag}.json"


def path_key(path: str) -> str:
    return f"images/paths/{hashlib.sha256(path.encode()).hexdigest()}.json"


def tag_image(store: Store, ref: str, manifest: Manifest) -> None:
    doc = {
        "image": manifest.id,
        "size": manifest.size,
        "block_size": manifest.block_size,
        "added": time.time(),
    }
    store.write_bytes(name_key(ref), json.dumps(doc).encode())


def lookup_name(store: Store, ref: str) -> Manifest:
    try:
        doc: Any = json.loads(store.read_bytes(name_key(ref)))
        image_id = doc["image"]
    except FileNotFoundError:
        raise UnknownImage(
            f"no image named {ref!r} in {store.uri} (see `bootseer image ls`)"
        ) from None
    except (ValueError, KeyError, TypeError):
        raise ManifestError(f"image name record {ref!r} is damaged") from None
    return load_manifest(store, str(image_id))


def list_names(store: Store) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for obj in store.list("images/names", recursive=True):
        parts = obj.key.split("/")
        if len(parts) != 4 or not parts[3].endswith(".json"):
            continue
        try:
            doc = json.loads(store.read_bytes(obj.key))
        except (ValueError, FileNotFoundError):
            continue
        out.append((f"{parts[2]}:{parts[3].removesuffix('.json')}", doc))
    return out


def list_paths(store: Store) -> list[dict[str, Any]]:
    out = []
    for obj in store.list("images/paths"):
        try:
            out.append(json.loads(store.read_bytes(obj.key)))
        except (ValueError, FileNotFoundError):
            continue
    return out


def remove_name(store: Store, ref: str) -> None:
    key = name_key(ref)
    if not store.exists(key):
        raise UnknownImage(f"no image named {ref!r}")
    store.delete(key)


def _path_record(store: Store, path: str, st: os.stat_result) -> Manifest | None:
    try:
        doc: Any = json.loads(store.read_bytes(path_key(path)))
    except (FileNotFoundError, ValueError):
        return None
    if (doc.get("path"), doc.get("size"), doc.get("mtime_ns")) != (
        path,
        st.st_size,
        st.st_mtime_ns,
    ):
        return None
    try:
        return load_manifest(store, str(doc.get("image")))
    except ManifestError:
        return None


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
) -> Manifest:
    """The manifest of the image file at ``path``, registering it if no node has yet.

    Many nodes may ask at once: the one that creates the lock hashes the file (from
    ``read_from`` if given: the checked descriptor's ``/proc/self/fd/N``); the others
    poll for the record for up to ``wait`` seconds, then raise
    :class:`RegistrationPending` (the job then reads the file directly).
    """
    found = _path_record(store, path, st)
    if found is not None:
        return found
    lock = RegistrationLock(
        store, f"images/locks/path-{path_key(path).rsplit('/', 1)[1][:-5]}-{st.st_mtime_ns}.lock"
    )
    until = time.monotonic() + wait
    while True:
        if lock.acquire():
            try:
                found = _path_record(store, path, st)  # done by whoever held the lock before
                if found is not None:
                    return found
                log(f"registering {path} ({st.st_size} bytes)")
                t0 = time.monotonic()
                manifest = hash_file(read_from or path, block_size)
                save_manifest(store, manifest)
                doc = {
                    "path": path,
                    "size": st.st_size,
                    "mtime_ns": st.st_mtime_ns,
                    "image": manifest.id,
                    "block_size": block_size,
                    "added": time.time(),
                }
                store.write_bytes(path_key(path), json.dumps(doc).encode())
                log(f"registered {path} as {manifest.id[:12]} in {time.monotonic() - t0:.1f}s")
                return manifest
            finally:
                lock.release()
        found = _path_record(store, path, st)
        if found is not None:
            return found
        if lock.stale():
            log(f"breaking stale registration lock {lock.key}")
            lock.release()
            continue
        if time.monotonic() >= until:
            raise RegistrationPending(f"{path} is being registered by another node")
        time.sleep(min(0.2, max(0.0, until - time.monotonic())))


def user_may_read(st: os.stat_result, uid: int, gid: int) -> bool:
    """Whether ``uid``/``gid`` may read a file with this stat (root's own checks do not apply)."""
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IRUSR)
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IRGRP)
    return bool(st.st_mode & stat.S_IROTH)


def _may_search(st: os.stat_result, uid: int, gid: int) -> bool:
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def check_image_file(path: str, uid: int, gid: int) -> os.stat_result:
    """Stat of the squashfs image at ``path`` if the job's user may read it; else StoreError."""
    fd, st = open_image_file(path, uid, gid)
    os.close(fd)
    return st


def open_image_file(path: str, uid: int, gid: int) -> tuple[int, os.stat_result]:
    """An open descriptor and stat of the squashfs image at ``path``, if the job's user
    may read it; else StoreError.

    The caller runs as root: every directory on the resolved path must be searchable
    by the user too, so a symlink cannot lead the agent where the user may not go.
    Read the image through the descriptor (``/proc/self/fd/N``), never by ``path``
    again: the user may swap a link on the path once this check is done.
    """
    real = os.path.realpath(path)
    parent = os.path.dirname(real)
    while True:
        try:
            dst = os.stat(parent)
        except OSError as exc:
            raise StoreError(f"image {path}: cannot stat {parent}: {exc.strerror}") from None
        if not _may_search(dst, uid, gid):
            raise StoreError(f"image {path}: directory {parent} is not searchable by uid {uid}")
        if parent == "/":
            break
        parent = os.path.dirname(parent)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise StoreError(f"image {path} does not exist") from None
    except OSError as exc:
        raise StoreError(f"cannot open image {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"image {path} is not a regular file")
        if not user_may_read(st, uid, gid):
            raise StoreError(f"image {path} is not readable by uid {uid}")
        if os.pread(fd, 4, 0) != SQUASHFS_MAGIC:
            raise StoreError(f"image {path} is not a squashfs file (no 'hsqs' magic)")
    except BaseException:
        os.close(fd)
        raise
    return fd, st
