"""A striped namespace's whole-file operations: open, list, remove, rename, verify, gc.

Where the files are is :mod:`bootseer.ckpt.layout`'s. Writing a file uploads the units
of a new version, then replaces the manifest (the commit, atomic through
:meth:`Store.writer`), then deletes the previous version's units. A crash before the
manifest switch leaves the previous version whole; the new version's units are orphans
that :meth:`Namespace.gc` removes.

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

import calendar
import errno
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, overload

from bootseer import digest as digests
from bootseer.ckpt.layout import Layout
from bootseer.ckpt.manifest import Manifest, Symlink
from bootseer.ckpt.names import check_link, check_path
from bootseer.errors import StoreError, describe
from bootseer.store import TMP_PREFIX

if TYPE_CHECKING:
    from bootseer.ckpt.reader import StripedReader
    from bootseer.ckpt.tree import Tree
    from bootseer.ckpt.writer import StripedWriter


@dataclass(frozen=True)
class Entry:
    name: str
    is_dir: bool
    # A file's manifest's mtime in the store's listing (about when the version was
    # committed; whole seconds on S3), 0 where the listing does not say.
    mtime: float = field(default=0.0, compare=False)


class Namespace(Layout):
    """One user's striped namespace over K stores."""

    # -- files
    @overload
    def open(self, path: str, mode: Literal["rb"] = "rb") -> StripedReader: ...
    @overload
    def open(self, path: str, mode: Literal["wb"]) -> StripedWriter: ...

    def open(self, path: str, mode: str = "rb") -> StripedReader | StripedWriter:
        """A file object: ``rb`` a seekable :class:`StripedReader`, ``wb`` a
        :class:`StripedWriter`."""
        check_path(path)
        # Imported here: a hook that only mounts (bootseer.ckpt.step) never pays for them.
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

    def is_dir(self, path: str, tree: Tree | None = None) -> bool:
        try:
            key = self.manifest_key(path, tree)
        except FileNotFoundError:
            return False
        return self.meta.is_dir(key)

    def listdir(self, path: str = "", tree: Tree | None = None) -> list[Entry]:
        """Files and directories directly under ``path``; a file's size and mtime are in
        its manifest (:meth:`manifest`), read only by callers that need them. Through the
        rename table (``tree``: this one, read before): a directory renamed away is not
        listed, one renamed here is. A caller that looks at the entries next passes the
        same table to :meth:`node`: a rename committed meanwhile must not make half of a
        listing the old directory's and half the new one's."""
        tree = tree or self.tree()
        key = self.manifest_key(path, tree)
        dirs = [Entry(d, True) for d in self.meta.list_dirs(key) if not d.startswith(TMP_PREFIX)]
        files = [Entry(obj.key.rsplit("/", 1)[-1], False, obj.mtime) for obj in self.meta.list(key)]
        found = [e for e in dirs + files if tree.shows(path, e.name)]
        for name in tree.extra_dirs(path):  # kept elsewhere: a directory, or a file made again
            sub = f"{path}/{name}" if path else name
            if self.node(sub, tree) is not None:
                found.append(Entry(name, False))
            elif self.is_dir(sub, tree):
                found.append(Entry(name, True))
        return sorted(found, key=lambda e: e.name)

    def walk(self, path: str = "") -> Iterator[str]:
        """Every file path under ``path``, depth first."""
        for e in self.listdir(path):
            sub = f"{path}/{e.name}" if path else e.name
            if e.is_dir:
                yield from self.walk(sub)
            else:
                yield sub

    def mkdir(self, path: str) -> None:
        """Make ``path`` a directory; a name renamed away before is made where nothing
        else is (its old place, when that is empty now, else a fresh one)."""
        self.meta.make_dir(self.claim(check_path(path)))

    def rmdir(self, path: str) -> None:
        if self.listdir(path):
            raise OSError(errno.ENOTEMPTY, f"{self.name}:{path}: directory not empty")
        self.meta.remove_dir(self.manifest_key(path))
        self.release(path)  # a renamed or remade directory: forget where it was

    def rename_dir(self, src: str, dst: str, replace: bool = True) -> None:
        """Rename the directory ``src`` to ``dst`` (absent, or an empty directory when
        ``replace``): one write of the rename table, whatever ``src`` holds; its files'
        manifests and units stay where they are."""
        check_path(src)
        check_path(dst)
        if _under(dst, src):
            raise OSError(errno.EINVAL, f"{self.name}: cannot move {src} into itself ({dst})")
        if not self.is_dir(src):
            raise NotADirectoryError(errno.ENOTDIR, f"{self.name}:{src} is not a directory")
        if self.node(dst) is not None:
            raise NotADirectoryError(errno.ENOTDIR, f"{self.name}:{dst} is not a directory")
        if self.is_dir(dst):
            if not replace:
                raise FileExistsError(errno.EEXIST, f"{self.name}:{dst} exists")
            if self.listdir(dst):
                raise OSError(errno.ENOTEMPTY, f"{self.name}:{dst}: directory not empty")
            self.rmdir(dst)
        tree = self.tree(fresh=True)
        place = tree.resolve(src)
        if place is None:
            raise FileNotFoundError(errno.ENOENT, f"no checkpoint directory {self.name}:{src}")
        self.commit_tree(tree.renamed(src, dst, place))

    def remove(self, path: str) -> Manifest | Symlink:
        """Remove a file: its manifest first (it is gone at once), then its units; or a
        symlink."""
        m = self.unname(path)
        if isinstance(m, Manifest):
            self.delete_units(m)
        return m

    def unname(self, path: str) -> Manifest | Symlink:
        """Remove a file's name and keep its units: what a descriptor still open on it
        reads, until its holder deletes them (:meth:`delete_units`)."""
        m = self.node(path)
        if m is None:
            raise FileNotFoundError(errno.ENOENT, f"no checkpoint file {self.name}:{path}")
        self.meta.delete(self.manifest_key(path))
        self.release(path)
        return m

    def rename(self, src: str, dst: str) -> None:
        """Point ``dst`` at ``src``'s version (or link), then drop ``src`` (units stay
        where they are)."""
        m = self.node(src)
        if m is None:
            raise FileNotFoundError(errno.ENOENT, f"no checkpoint file {self.name}:{src}")
        old = self.manifest(dst)
        if isinstance(m, Manifest):
            self.commit(dst, m)
        else:
            self.commit_link(dst, m)
        self.meta.delete(self.manifest_key(src))
        self.release(src)
        if old is not None and (not isinstance(m, Manifest) or old.version != m.version):
            self.delete_units(old)

    def symlink(self, path: str, target: str) -> Symlink:
        """Make ``path`` a symlink to ``target`` (relative, inside the namespace:
        :func:`check_link`); EEXIST when ``path`` is taken."""
        check_path(path)
        check_link(path, target)
        if self.node(path) is not None or self.is_dir(path):
            raise FileExistsError(errno.EEXIST, f"{self.name}:{path} exists")
        link = Symlink(target, time.time())
        self.commit_link(path, link)
        return link

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
            elif not digests.matches(data, digest):
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


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top + "/")


def _version_time(version: str) -> float:
    try:
        return float(calendar.timegm(time.strptime(version[:15], "%Y%m%dT%H%M%S")))
    except ValueError:
        return 0.0
