"""What ``bootseer ckpt ls NAMESPACE[:PATH]`` lists, the same for root (straight from
the store) and for a user (through the agent's checkpoint door).

A directory lists its entries; a file lists itself; a path that is neither is
``FileNotFoundError`` (ENOENT), as ``ls`` of a missing file is anywhere. A namespace
is there once something is stored in it: the command says ENOENT for an empty one
(:func:`check_found`; the agent's door answers it with no entries). A file whose
manifest vanished between the listing and the read (removed meanwhile) is left out.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING

from bootseer.agentapi.ckpt import CkptEntry
from bootseer.ckpt.manifest import Manifest

if TYPE_CHECKING:
    from bootseer.ckpt.namespace import Namespace


def entry(name: str, m: Manifest) -> CkptEntry:
    return CkptEntry(name, False, m.size, m.mtime, m.unit_count, len(m.targets), m.version)


def list_path(
    ns: Namespace, path: str = "", limit: int | None = None
) -> tuple[list[CkptEntry], int]:
    """The entries ``ls`` shows for ``path`` (at most ``limit``) and how many more there
    were; through one rename table (a rename meanwhile must not cut the listing)."""
    tree = ns.tree()
    if path and not ns.is_dir(path, tree):
        node = ns.node(path, tree)
        m = node if isinstance(node, Manifest) else None
        if m is None:
            raise FileNotFoundError(
                errno.ENOENT, f"{ns.name}:{path}: no such checkpoint file or directory"
            )
        return [entry(path.rsplit("/", 1)[-1], m)], 0
    listing = ns.listdir(path, tree)
    shown = listing if limit is None else listing[:limit]
    out: list[CkptEntry] = []
    for e in shown:
        if e.is_dir:
            out.append(CkptEntry(e.name, True))
            continue
        node = ns.node(f"{path}/{e.name}" if path else e.name, tree)
        if isinstance(node, Manifest):
            out.append(entry(e.name, node))
    return out, len(listing) - len(shown)


def check_found(remote: str, path: str, entries: list[CkptEntry]) -> None:
    """``ls NAMESPACE`` of a namespace with nothing in it: ENOENT."""
    if not entries and not path:
        raise FileNotFoundError(
            errno.ENOENT, f"{remote}: no such checkpoint namespace (nothing stored in it)"
        )
