"""Where a striped namespace keeps its files on its K targets.

A namespace ``<user>/<name>`` (``ada/llama-25b``) has, on every target::

    <user>/<name>/units/<version>/<unit>     stripe units of one version of one file
and, on the first target only::

    <user>/<name>/files/<path>               the manifest of the file's current version
    <user>/<name>/tree.json                  the rename table (:mod:`bootseer.ckpt.tree`)
    <user>/<name>/dirs/<id>/<path>           manifests of a directory made again after a rename

A mount daemon (root, with the site keys) reads those sealed records through the node's
record cache (:class:`bootseer.recordcache.RecordCache`, ``latest``): the first
target's copy, kept on the node; the node's copy when that target fails or does not
answer within 5 s, so an outage of the first target costs no file the node has read
before (its last version seen here; the units then come from the other targets and the
job's peers).

:class:`Layout` holds those keys, reads and commits manifests, and counts what reading
units moved: all the reader and the writer need (:mod:`bootseer.ckpt.reader`,
:mod:`bootseer.ckpt.writer`). The whole-file operations built on them are
:class:`bootseer.ckpt.namespace.Namespace`'s.
"""

from __future__ import annotations

import contextlib
import errno
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Self

from bootseer import sitekey
from bootseer.ckpt.errors import CkptError, CkptIOError
from bootseer.ckpt.manifest import MAX_MANIFEST_BYTES, Manifest, Symlink, parse_node
from bootseer.ckpt.names import check_path
from bootseer.ckpt.tree import MAX_TREE_BYTES, TREE_KEY, Tree, fresh_place, parse_tree
from bootseer.directio import Buffers
from bootseer.errors import ManifestError, StoreError
from bootseer.sitekey import SealError, SiteKeys
from bootseer.store import Store, check_key

if TYPE_CHECKING:
    from bootseer.ckpt.quota import QuotaGuard
    from bootseer.config import CkptSection, SiteConfig
    from bootseer.p2p.via import Via
    from bootseer.recordcache import RecordCache


class Layout:
    """One user's striped namespace over K stores: its keys and manifests."""

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
        # The node's copies of the manifests and the rename table (a mount daemon's,
        # which has ``keys``): served when the first target fails or hangs.
        self.records: RecordCache | None = None
        # The quotas of a root-run writer (bootseer.ckpt.quota): every upload of a new
        # version is charged to it first; None (the Python API, root's CLI): none.
        self.quota: QuotaGuard | None = None
        # The page-aligned buffers units are read into and filled in, kept across the
        # files a process opens and writes (a mount serves many): a fresh buffer's pages
        # are zeroed by the kernel as they are first touched, which cost a rank's part of
        # a file more CPU than hashing it (docs/performance.md, "A part of a checkpoint"),
        # and a writer 10 units' worth per file. At most one reading file's worth are kept
        # between reads: its read-ahead, the unit read and the 3 before it (reader.LATE),
        # a unit per fetch in flight; a writer uses up to max_inflight + 2 of them.
        self.buffers = Buffers(read_ahead + 4 + max_inflight, least=unit_size)
        self.store_bytes = 0
        self.peer_bytes = 0
        self.corrupt_units = 0  # units refused: their checksum is not the manifest's
        # The rename table, read again when older than tree_ttl seconds (the kernel
        # caches names as long: bootseer.ckptd.fs.TIMEOUT); 0 reads it every time.
        self.tree_ttl = 1.0
        self._tree: Tree | None = None
        self._tree_at = 0.0
        self._tree_lock = threading.Lock()

    @classmethod
    def from_config(
        cls,
        cfg: SiteConfig,
        name: str,
        section: CkptSection | None = None,
        keys: SiteKeys | None = None,
    ) -> Self:
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
        return f"{type(self).__name__}({self.name!r}, K={len(self.targets)})"

    # -- keys
    @property
    def meta(self) -> Store:
        return self.targets[0]

    def manifest_key(self, path: str, tree: Tree | None = None) -> str:
        """Where ``path``'s manifest (or directory) is kept, through the rename table
        (``tree``: this one, read before); ENOENT when its name is gone (a directory
        renamed away)."""
        place = (tree or self.tree()).resolve(check_path(path) if path else "")
        if place is None:
            raise FileNotFoundError(errno.ENOENT, f"no checkpoint file {self.name}:{path}")
        return f"{self.name}/{place}"

    # -- the rename table
    @property
    def tree_key(self) -> str:
        return f"{self.name}/{TREE_KEY}"

    def tree(self, fresh: bool = False) -> Tree:
        """The rename table, cached for ``tree_ttl`` seconds (``fresh``: read now)."""
        now = time.monotonic()
        with self._tree_lock:
            if not fresh and self._tree is not None and now - self._tree_at < self.tree_ttl:
                return self._tree
        t = self._read_tree()
        with self._tree_lock:
            self._tree, self._tree_at = t, now
        return t

    def _kept(self, key: str, limit: int) -> bytes | None:
        """The sealed record at ``key`` through the node's record cache (None: no cache
        here, or an empty object, a directory's on some stores: read the target as
        ever); raises as :meth:`RecordCache.latest`."""
        if self.records is None or self.keys is None:
            return None
        raw = self.records.latest(self.meta, key, limit + 1, sitekey.CKPT_MANIFEST, self.keys)
        if not raw:
            return None
        if len(raw) > limit:
            raise ManifestError(f"bad record {key}: larger than {limit} bytes")
        return raw

    def _read_tree(self) -> Tree:
        key = self.tree_key
        try:
            raw = self._kept(key, MAX_TREE_BYTES + sitekey.SEAL_BYTES)
            if raw is None:
                info = self.meta.info(key)
                if info is None or info.is_dir:
                    return Tree()
                if info.size > MAX_TREE_BYTES + sitekey.SEAL_BYTES:
                    raise ManifestError(f"bad rename table: larger than {MAX_TREE_BYTES} bytes")
                raw = self.meta.read_bytes(key)
        except (FileNotFoundError, IsADirectoryError):
            return Tree()
        except ManifestError as exc:
            raise CkptIOError(f"{self.name}: {exc}") from None
        except StoreError as exc:
            raise CkptIOError(f"{self.name}: cannot read its rename table: {exc}") from None
        try:
            return parse_tree(sitekey.open_with(self.keys, sitekey.CKPT_MANIFEST, key, raw))
        except ManifestError as exc:
            raise CkptIOError(f"{self.name}: {exc}") from None
        except SealError as exc:
            raise CkptIOError(f"{self.name}: its rename table: {exc}") from None

    def claim(self, path: str) -> str:
        """The key for a new file, link or directory at ``path``: a name renamed away
        (gone in the table) gets its old place again when that is empty, else a fresh
        one; ENOENT when a directory above it is gone."""
        try:
            return self.manifest_key(path)
        except FileNotFoundError:
            pass
        tree = self.tree(fresh=True)
        if path in tree.dirs and tree.dirs[path] is None:
            old = tree.plain(path)
            if old is not None and self._place_used(old):
                self.commit_tree(tree.with_entry(path, fresh_place()))
            else:
                self.commit_tree(tree.without(path))
        return self.manifest_key(path)

    def release(self, path: str) -> None:
        """After ``path`` was removed or renamed: drop its table entry, or mark the name
        gone while its plain place holds another's files."""
        if path not in self.tree().dirs:  # most removals: no entry, no request
            return
        tree = self.tree(fresh=True)
        freed = tree.dirs.get(path)
        if freed is None:
            return
        plain = tree.plain(path)
        gone = plain is not None and self._place_used(plain)
        tree = tree.with_entry(path, None) if gone else tree.without(path)
        # The name renamed away from the place just freed may have it back: forget it.
        for name in [n for n, p in tree.dirs.items() if p is None and tree.plain(n) == freed]:
            if not self._place_used(freed):
                tree = tree.without(name)
        self.commit_tree(tree)

    def _place_used(self, place: str) -> bool:
        key = f"{self.name}/{place}"
        return self.meta.info(key) is not None or self._is_dir(key)

    def commit_tree(self, tree: Tree) -> None:
        """Make ``tree`` the rename table: one object written, the whole change at once."""
        key = self.tree_key
        if tree.dirs:
            body = sitekey.seal_with(self.keys, sitekey.CKPT_MANIFEST, key, tree.to_json())
            self.meta.write_bytes(key, body)
        else:
            with contextlib.suppress(FileNotFoundError):
                self.meta.delete(key)
        with self._tree_lock:
            self._tree, self._tree_at = tree, time.monotonic()

    def unit_key(self, version: str, unit: str) -> str:
        return f"{self.name}/units/{version}/{unit}"

    def store_for(self, uri: str) -> Store:
        try:
            return self.by_uri[uri]
        except KeyError:
            raise CkptError(f"target {uri} is not among this namespace's targets") from None

    # -- manifests
    def manifest(self, path: str) -> Manifest | None:
        """The current version's manifest, or None when ``path`` is no file (nothing, a
        directory or a symlink); a manifest that cannot be read or does not check out
        raises :class:`CkptIOError` (EIO) naming the file."""
        node = self.node(path)
        return node if isinstance(node, Manifest) else None

    def node(self, path: str, tree: Tree | None = None) -> Manifest | Symlink | None:
        """What ``path``'s key holds: a file's manifest, a symlink, or None (nothing, or a
        directory); errors as :meth:`manifest`'s. ``tree`` as :meth:`manifest_key`'s."""
        try:
            key = self.manifest_key(path, tree)
        except FileNotFoundError:
            return None
        try:
            raw = self._kept(key, MAX_MANIFEST_BYTES + sitekey.SEAL_BYTES)
            if raw is None:
                info = self.meta.info(key)
                if info is None or info.is_dir:
                    return None
                if info.size > MAX_MANIFEST_BYTES + sitekey.SEAL_BYTES:
                    raise ManifestError(f"bad manifest: larger than {MAX_MANIFEST_BYTES} bytes")
                raw = self.meta.read_bytes(key)
        except (FileNotFoundError, IsADirectoryError):
            return None
        except StoreError as exc:
            if self._is_dir(key):  # made a directory since the look above
                return None
            raise CkptIOError(f"{self.name}:{path}: cannot read its manifest: {exc}") from None
        try:
            raw = sitekey.open_with(self.keys, sitekey.CKPT_MANIFEST, key, raw)
            return parse_node(raw, frozenset(self.by_uri))
        except (ManifestError, SealError) as exc:
            # An I/O error (EIO), never "no such file": a script would start from step 0.
            raise CkptIOError(f"{self.name}:{path}: {exc}") from None

    def _is_dir(self, key: str) -> bool:
        """Whether the store says ``key`` is a directory (by its type, never by an
        error's text: that differs between stores and versions of pyarrow)."""
        try:
            return self.meta.is_dir(key)
        except (OSError, StoreError):
            return False

    def commit(self, path: str, manifest: Manifest) -> None:
        """Make ``manifest`` the file's current version (atomic), sealed with ``keys``."""
        key = self.claim(path)
        body = sitekey.seal_with(self.keys, sitekey.CKPT_MANIFEST, key, manifest.to_json())
        self.meta.write_bytes(key, body)

    def commit_link(self, path: str, link: Symlink) -> None:
        """Make ``path`` the symlink ``link`` (atomic, sealed like a manifest)."""
        key = self.claim(path)
        body = sitekey.seal_with(self.keys, sitekey.CKPT_MANIFEST, key, link.to_json())
        self.meta.write_bytes(key, body)

    def delete_units(self, m: Manifest) -> None:
        """Delete a version's unit objects: one prefix delete per target (batched on S3),
        not a request per unit; best effort, gc catches the rest."""
        for uri in set(m.targets):
            with contextlib.suppress(Exception):
                self.store_for(uri).delete_prefix(f"{self.name}/units/{m.version}")
