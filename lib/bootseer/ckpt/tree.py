"""Where a namespace's directories are kept: the rename table that makes a directory
rename one atomic commit.

A file's manifest is under ``<ns>/files/<path>`` (:mod:`bootseer.ckpt.layout`). A
directory renamed is not copied: one object, ``<ns>/tree.json`` on the first target
(sealed like a manifest), maps the new name to where the directory's manifests stay::

    {"format": 1, "dirs": {"checkpoint-2": "files/tmp-ckpt-2", "tmp-ckpt-2": null}}

A path resolves by its longest mapped prefix (none: ``files/<path>``, the plain layout);
``null`` is a name that is gone (renamed away: what was there is reached under its new
name only). Writing that one object is the commit: every node that reads the table sees
the old tree or the new one, whatever the directory holds. A name made again after it
went (``mkdir tmp-ckpt-2`` for the next save) is mapped to a fresh ``dirs/<id>`` when
its old place is still in use, so no two names share a place.

    >>> t = Tree().renamed("tmp", "ckpt-2", "files/tmp")
    >>> t.resolve("ckpt-2/model.pt"), t.resolve("tmp/model.pt"), t.resolve("other")
    ('files/tmp/model.pt', None, 'files/other')
    >>> t.shows("", "tmp"), t.extra_dirs("")
    (False, ['ckpt-2'])
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from bootseer import jsonlimits
from bootseer.ckpt.names import check_path
from bootseer.errors import ManifestError

FORMAT = 1
MAX_TREE_BYTES = 16 << 20
TREE_KEY = "tree.json"  # under the namespace's prefix
_PLACE = re.compile(r"^(files|dirs/[0-9a-f]{32})(/.+)?$")


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top + "/")


def fresh_place() -> str:
    """A place for a directory made where an old one still is: never a plain path."""
    return f"dirs/{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Tree:
    """The rename table: directory path -> place (``files/<path>``, ``dirs/<id>``) or
    None (gone)."""

    dirs: dict[str, str | None] = field(default_factory=dict)

    # -- reading
    def _match(self, path: str) -> tuple[str, str | None] | None:
        """The longest mapped prefix of ``path`` and its place."""
        if not self.dirs:
            return None
        p = path
        while True:
            if p in self.dirs:
                return p, self.dirs[p]
            if "/" not in p:
                return None
            p = p.rsplit("/", 1)[0]

    def resolve(self, path: str) -> str | None:
        """Where ``path`` is kept, relative to the namespace's prefix (``files/...``,
        ``dirs/<id>/...``); None when its name is gone. ``""`` is the root."""
        if not path:
            return "files"
        hit = self._match(path)
        if hit is None:
            return f"files/{path}"
        top, place = hit
        return None if place is None else place + path[len(top) :]

    def plain(self, path: str) -> str | None:
        """Where ``path`` would be kept without its own entry (by its parent's place)."""
        if not path:
            return "files"
        parent = self.resolve(_parent(path))
        return None if parent is None else f"{parent}/{path.rsplit('/', 1)[-1]}"

    def shows(self, parent: str, name: str) -> bool:
        """Whether ``name``, found in ``parent``'s place, is ``parent/name`` (not a name
        renamed away, nor one mapped elsewhere)."""
        child = f"{parent}/{name}" if parent else name
        return self.resolve(child) == self.plain(child)

    def extra_dirs(self, parent: str) -> list[str]:
        """Names in ``parent`` kept elsewhere: directories renamed into it, and names
        renamed away then made again (a directory, a file or a link) while their old
        place holds another's files."""
        out = []
        for path, place in self.dirs.items():
            if place is not None and _parent(path) == parent and place != self.plain(path):
                out.append(path.rsplit("/", 1)[-1])
        return sorted(out)

    # -- changing (each returns a new table: the caller commits it whole)
    def renamed(self, src: str, dst: str, place: str) -> Tree:
        """``src`` (kept at ``place``) renamed to ``dst`` (absent, or an empty directory
        already removed), with every entry below it."""
        out: dict[str, str | None] = {
            p: v for p, v in self.dirs.items() if not _under(p, src) and not _under(p, dst)
        }
        for p, v in self.dirs.items():
            if _under(p, src) and p != src:
                out[dst + p[len(src) :]] = v
        t = Tree(out)
        if t.plain(dst) != place:
            out[dst] = place
        if Tree(out).resolve(src) is not None or Tree(out).plain(src) == place:
            out[src] = None
        return Tree(out)

    def with_entry(self, path: str, place: str | None) -> Tree:
        out = dict(self.dirs)
        if place is None or place != Tree(out).plain(path):
            out[path] = place
        else:
            out.pop(path, None)
        return Tree(out)

    def without(self, path: str) -> Tree:
        out = dict(self.dirs)
        out.pop(path, None)
        return Tree(out)

    # -- the stored form
    def to_json(self) -> bytes:
        return json.dumps({"format": FORMAT, "dirs": self.dirs}, separators=(",", ":")).encode()


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise ManifestError(f"bad rename table: {what}")


def parse_tree(raw: bytes) -> Tree:
    """Check and decode a rename table (root reads what a user's namespace holds)."""
    try:
        doc = jsonlimits.loads(raw, max_bytes=MAX_TREE_BYTES, what="rename table")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ManifestError(f"bad rename table: not JSON ({exc})") from None
    _need(isinstance(doc, dict) and doc.get("format") == FORMAT, "format")
    dirs = doc.get("dirs")
    _need(isinstance(dirs, dict), "dirs")
    out: dict[str, str | None] = {}
    for path, place in dirs.items():
        try:
            check_path(path)
        except ValueError as exc:
            raise ManifestError(f"bad rename table: {exc}") from None
        if place is not None:
            _need(isinstance(place, str) and bool(_PLACE.match(place)), f"place {place!r}")
            try:
                check_path(place.split("/", 2)[-1] if place.startswith("dirs/") else place[6:])
            except ValueError as exc:
                raise ManifestError(f"bad rename table: {exc}") from None
        out[path] = place
    return Tree(out)
