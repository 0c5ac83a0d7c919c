"""Where a striped namespace keeps its files on its K targets, and the whole-file operations.

A namespace ``<user>/<name>`` (``ada/llama-25b``) has, on every target::

    <user>/<name>/units/<version>/<unit>     stripe units of one version of one file
and, on the first target only::

    <user>/<name>/files/<path>               the manifest of the file's current version

Writing a file uploads the units of a new version, then replaces the manifest (the
commit, atomic through :meth:`Store.writer`), then deletes the previous version's
units. A crash before the manifest switch leaves the previous version whole; the new
version's units are orphans that :meth:`Namespace.gc` removes.

    >>> from bootseer.store import open_store
    >>> ns = Namespace([open_store("file:///tmp/doc-t1"), open_store("file:///tmp/doc-t2")],
    ...                "ada/demo", unit_size=4)
    >>> with ns.open("a/b.bin", "wb") as f:
    ...     _ = f.write(b"0123456789")
    >>> with ns.open("a/b.bin") as f:
    ...     f.read()
    b'0123456789'
"""

from __future__ import annotations

import contextlib
import errno
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, overload

from bootseer import sitekey
from bootseer.ckpt.manifest import (
    MAX_MANIFEST_BYTES,
    Manifest,
    ManifestError,
    parse,
    unit_checksum,
)
from bootseer.errors import BootseerError, StoreError, describe
from bootseer.sitekey import SealError, SiteKeys
from bootseer.store import TMP_PREFIX, Store, check_key

if TYPE_CHECKING:
    from bootseer.ckpt.quota import QuotaGuard
    from bootseer.ckpt.reader import StripedReader
    from bootseer.ckpt.writer import StripedWriter
    from bootseer.config import CkptSection, SiteConfig
    from bootseer.p2p.via import Via

MAX_PATH = 1024
_PART = re.compile(r"^[A-Za-z0-9._@+=:-]{1,255}$")
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_NS_PART = re.compile(r"^[A-Za-z0-9._-]+$")


class CkptError(BootseerError):
    """Striped checkpoint storage failed; the message names the file and what to check."""


class CkptPathError(CkptError, ValueError):
    """A file or namespace name would leave its namespace or is not a valid key."""


class CkptIOError(CkptError, OSError):
    """A unit could not be read or is damaged: an I/O error to file-object callers."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EIO, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def check_path(path: str) -> str:
    """``path`` if it is a safe relative file name in a namespace, else :class:`CkptPathError`."""
    parts = path.split("/")
    if (
        not path
        or len(path) > MAX_PATH
        or path.startswith("/")
        or any(p in (".", "..") or not _PART.match(p) or p.startswith(TMP_PREFIX) for p in parts)
    ):
        raise CkptPathError(
            f"invalid checkpoint path {path!r}: want a relative name of A-Z a-z 0-9 . _ @ + = : - "
            f"parts joined by '/', without '.', '..' or parts starting with {TMP_PREFIX!r}"
        )
    return path


def namespace_name(user: str, name: str) -> str:
    """``<user>/<name>``, refusing anything that could leave the user's part of the targets."""
    parts = name.split("/")
    if not _USER.match(user) or user in (".", ".."):
        raise CkptPathError(f"invalid user name {user!r} for a checkpoint namespace")
    if not name or len(name) > 256 or any(p in (".", "..") or not _NS_PART.match(p) for p in parts):
        raise CkptPathError(
            f"invalid checkpoint namespace {name!r}: a relative name of A-Z a-z 0-9 . _ - parts "
            "joined by '/', without '.' or '..'"
        )
    return f"{user}/{name}"


@dataclass(frozen=True)
class Entry:
    name: str
    is_dir: bool


class Namespace:
    """One user's striped namespace over K stores."""

    def __init__(
        self,
        targets: Sequence[Store],
        name: str,
        unit_size: int = 8 << 20,
        read_ahead: int = 16,
        max_inflight: int = 8,
        verify: bool = True,
        keys: SiteKeys | None = None,
    ) -> None:
        """``keys``: the site keys of a root-run part (the mount daemon, an admin), which
        seals the manifests it commits and refuses those that do not verify; None (a
        user's own process, without the key) commits unsealed manifests, which no mount
        will serve, and reads manifests unchecked (docs/security.md)."""
        if not targets:
            raise CkptError("no checkpoint targets: set [ckpt] targets in the site config")
        if unit_size <= 0 or max_inflight <= 0:
            raise CkptError("[ckpt] unit_size and max_inflight must be positive")
        check_key(name)
        self.targets = list(targets)
        self.by_uri = {s.uri: s for s in self.targets}
        self.name = name
        self.unit_size = unit_size
        self.read_ahead = read_ahead
        self.max_inflight = max_inflight
        self.verify = verify
        self.keys = keys
        # Units through the job's peers (bootseer.p2p.via), set by the mount daemon of a
        # job on several nodes; and where the units it read came from.
        self.via: Via | None = None
        # The quotas of a root-run writer (bootseer.ckpt.quota): every upload of a new
        # version is charged to it first; None (the Python API, root's CLI): none.
        self.quota: QuotaGuard | None = None
        self.store_bytes = 0
        self.peer_bytes = 0
        self.corrupt_units = 0  # units refused: their checksum is not the manifest's

    @classmethod
    def from_config(
        cls,
        cfg: SiteConfig,
        name: str,
        section: CkptSection | None = None,
        keys: SiteKeys | None = None,
    ) -> Namespace:
        """The namespace ``name`` (``<user>/<ns>``) over the site's ``[ckpt] targets``."""
        sec = section or cfg.ckpt
        stores = []
        for uri in sec.targets:
            try:
                stores.append(cfg.store.open_uri(uri))
            except StoreError as exc:
                raise CkptError(f"checkpoint target {uri} is not reachable: {exc}") from None
        return cls(
            stores, name, sec.unit_size, sec.read_ahead, sec.max_inflight, sec.verify, keys=keys
        )

    def __repr__(self) -> str:
        return f"Namespace({self.name!r}, K={len(self.targets)})"

    # -- keys
    @property
    def meta(self) -> Store:
        return self.targets[0]

    def manifest_key(self, path: str) -> str:
        return f"{self.name}/files/{check_path(path)}" if path else f"{self.name}/files"

    def unit_key(self, version: str, unit: str) -> str:
        return f"{self.name}/units/{version}/{unit}"

    def store_for(self, uri: str) -> Store:
        try:
            return self.by_uri[uri]
        except KeyError:
            raise CkptError(f"target {uri} is not among this namespace's targets") from None

    # -- manifests
    def manifest(self, path: str) -> Manifest | None:
        """The current version's manifest, or None when ``path`` is no file; a manifest
        that cannot be read or does not check out raises :class:`CkptIOError` (EIO)
        naming the file."""
        key = self.manifest_key(path)
        try:
            info = self.meta.info(key)
            if info is None:
                return None
            if info.size > MAX_MANIFEST_BYTES + sitekey.SEAL_BYTES:
                raise ManifestError(f"bad manifest: larger than {MAX_MANIFEST_BYTES} bytes")
            raw = self.meta.read_bytes(key)
        except (FileNotFoundError, IsADirectoryError):
            return None
        except StoreError as exc:
            if _is_dir_error(exc):
                return None
            raise CkptIOError(f"{self.name}:{path}: cannot read its manifest: {exc}") from None
        try:
            raw = sitekey.open_with(self.keys, sitekey.CKPT_MANIFEST, key, raw)
            return parse(raw, frozenset(self.by_uri))
        except (ManifestError, SealError) as exc:
            # An I/O error (EIO), never "no such file": a script would start from step 0.
            raise CkptIOError(f"{self.name}:{path}: {exc}") from None

    def commit(self, path: str, manifest: Manifest) -> None:
        """Make ``manifest`` the file's current version (atomic), sealed with ``keys``."""
        key = self.manifest_key(path)
        body = sitekey.seal_with(self.keys, sitekey.CKPT_MANIFEST, key, manifest.to_json())
        self.meta.write_bytes(key, body)

    # -- files
    @overload
    def open(self, path: str, mode: Literal["rb"] = "rb") -> StripedReader: ...
    @overload
    def open(self, path: str, mode: Literal["wb"]) -> StripedWriter: ...

    def open(self, path: str, mode: str = "rb") -> StripedReader | StripedWriter:
        """A file object: ``rb`` a seekable :class:`StripedReader`, ``wb`` a
        :class:`StripedWriter`."""
        check_path(path)
        if mode == "rb":
            from bootseer.ckpt.reader import StripedReader

            m = self.manifest(path)
            if m is None:
                raise FileNotFoundError(errno.ENOENT, f"no checkpoint file {self.name}:{path}")
            return StripedReader(self, path, m)
        if mode == "wb":
            from bootseer.ckpt.writer import StripedWriter

            if self.is_dir(path):
                raise IsADirectoryError(errno.EISDIR, f"{self.name}:{path} is a directory")
            return StripedWriter(self, path)
        raise ValueError(f"mode must be 'rb' or 'wb', not {mode!r}")

    def is_dir(self, path: str) -> bool:
        return self.meta.is_dir(self.manifest_key(path))

    def listdir(self, path: str = "") -> list[Entry]:
        """Files and directories directly under ``path``; a file's size and mtime are in
        its manifest (:meth:`manifest`), read only by callers that need them."""
        key = self.manifest_key(path)
        dirs = [Entry(d, True) for d in self.meta.list_dirs(key) if not d.startswith(TMP_PREFIX)]
        files = [Entry(obj.key.rsplit("/", 1)[-1], False) for obj in self.meta.list(key)]
        return sorted(dirs + files, key=lambda e: e.name)

    def walk(self, path: str = "") -> Iterator[str]:
        """Every file path under ``path``, depth first."""
        for e in self.listdir(path):
            sub = f"{path}/{e.name}" if path else e.name
            if e.is_dir:
                yield from self.walk(sub)
            else:
                yield sub

    def mkdir(self, path: str) -> None:
        self.meta.make_dir(self.manifest_key(path))

    def rmdir(self, path: str) -> None:
        if self.listdir(path):
            raise OSError(errno.ENOTEMPTY, f"{self.name}:{path}: directory not empty")
        self.meta.remove_dir(self.manifest_key(path))

    def remove(self, path: str) -> Manifest:
        """Remove a file: its manifest first (it is gone at once), then its units."""
        m = self.manifest(path)
        if m is None:
            raise FileNotFoundError(errno.ENOENT, f"no checkpoint file {self.name}:{path}")
        self.meta.delete(self.manifest_key(path))
        self.delete_units(m)
        return m

    def rename(self, src: str, dst: str) -> None:
        """Point ``dst`` at ``src``'s version, then drop ``src`` (units stay where they are)."""
        m = self.manifest(src)
        if m is None:
            raise FileNotFoundError(errno.ENOENT, f"no checkpoint file {self.name}:{src}")
        old = self.manifest(dst)
        self.commit(dst, m)
        self.meta.delete(self.manifest_key(src))
        if old is not None and old.version != m.version:
            self.delete_units(old)

    def delete_units(self, m: Manifest) -> None:
        """Delete a version's unit objects: one prefix delete per target (batched on S3),
        not a request per unit; best effort, gc catches the rest."""
        for uri in set(m.targets):
            with contextlib.suppress(Exception):
                self.store_for(uri).delete_prefix(f"{self.name}/units/{m.version}")

    def verify_file(self, path: str, progress: Callable[[int], None] | None = None) -> list[str]:
        """Read every unit of ``path`` and check its checksum; the problems found, if any."""
        m = self.manifest(path)
        if m is None:
            return [f"{self.name}:{path}: no such file"]
        problems = []
        for i, (unit, digest) in enumerate(m.units):
            store = self.store_for(m.target_of(i))
            try:
                data = store.read_bytes(self.unit_key(m.version, unit))
            except (FileNotFoundError, StoreError) as exc:
                problems.append(f"{path}: unit {i} on {store.uri}: {describe(exc)}")
                continue
            if len(data) != m.unit_length(i):
                problems.append(
                    f"{path}: unit {i} on {store.uri}: {len(data)} bytes, want {m.unit_length(i)}"
                )
            elif unit_checksum(data) != digest:
                problems.append(f"{path}: unit {i} on {store.uri}: checksum mismatch")
            if progress:
                progress(len(data))
        return problems

    def gc(self, min_age: float = 3600.0) -> int:
        """Delete unit versions no manifest names and older than ``min_age`` seconds.

        They are left by writers that crashed or lost a race; the age keeps writes in
        progress (whose manifest is not written yet) safe. Returns the versions removed.
        """
        live = set()
        for path in self.walk():
            m = self.manifest(path)
            if m is not None:
                live.add(m.version)
        cutoff = time.time() - min_age
        removed: set[str] = set()
        for store in self.targets:
            for version in store.list_dirs(f"{self.name}/units"):
                if version in live or _version_time(version) > cutoff:
                    continue
                store.delete_prefix(f"{self.name}/units/{version}")
                removed.add(version)
        return len(removed)


def _version_time(version: str) -> float:
    import calendar

    try:
        return float(calendar.timegm(time.strptime(version[:15], "%Y%m%dT%H%M%S")))
    except ValueError:
        return 0.0


def _is_dir_error(exc: Exception) -> bool:
    text = str(exc).lower()
    return "is a directory" in text or ("directory" in text and "not a file" in text)
