"""A user's looks at the store through the agent: what is hers to see, nothing more.

A user holds no store credentials and cannot read the sealed records, so the agent
(root) answers for her, knowing her by ``SO_PEERCRED`` (:mod:`bootseer.image.views`,
:mod:`bootseer.deps.views` decide what she may see)::

    {"op": "image_ls"}  /  {"op": "image_show", "ref": "pytorch:24.05"}
    {"op": "deps_ls", "scopes": ["user/alice"]}  /  {"op": "deps_show", "scope": "", "key": K}

    >>> from bootseer.jsondecode import decode
    >>> decode(DepsList, {"op": "deps_ls", "scopes": ["user/alice"]})
    DepsList(scopes=('user/alice',))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from bootseer.agentapi.wire import Reply, Request
from bootseer.jsondecode import Items, Text

MAX_VIEW_SCOPES = 64  # scopes one deps_ls names at most

Name = Annotated[str, Text(1024, plain=True)]


# -- replies -------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageName:
    """One registered name: the image it stands for, its size, when it was added."""

    name: str
    image: str
    size: int
    added: float


@dataclass(frozen=True)
class ImageListReply(Reply):
    """The names a job may ask for; how many more there were than the agent lists."""

    images: list[ImageName]
    left_out: int = 0


@dataclass(frozen=True)
class ImageShowReply(Reply):
    """``bootseer image show``'s document (``image.views.image_doc``): the image's id,
    size, blocks, its name's ``trace_owner``, and ``traces`` by user (the caller's and
    the trace owner's only), printed as JSON as it is."""

    doc: dict[str, object]


@dataclass(frozen=True)
class SnapshotRow:
    """One snapshot in a scope (``bootseer.deps.gc.SnapshotInfo``)."""

    scope: str
    key: str
    size: int  # bytes in the store
    created: float
    last_used: float


@dataclass(frozen=True)
class DepsListReply(Reply):
    snapshots: list[SnapshotRow]
    scopes: list[str]


@dataclass(frozen=True)
class DepsShowReply(Reply):
    """The snapshot's manifest as stored (``bootseer.deps.manifest.Manifest.to_json``),
    verified by the agent, and its size in the store."""

    manifest: str
    size: int


# -- requests ------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageList(Request[ImageListReply]):
    """The registered image names (any user: a name is published to every job user)."""

    op = "image_ls"
    timeout = 60.0


@dataclass(frozen=True)
class ImageShow(Request[ImageShowReply]):
    """One image name's manifest and the traces the caller's jobs of it use (any user: a
    name is published to every job user; a path or an image id is root's ``image show``)."""

    op = "image_show"
    timeout = 60.0
    ref: Name


@dataclass(frozen=True)
class DepsList(Request[DepsListReply]):
    """The caller's snapshots in ``scopes`` (none: her user scope), each a scope she may
    restore from (:mod:`bootseer.deps.views`)."""

    op = "deps_ls"
    timeout = 60.0
    scopes: Annotated[tuple[Name, ...], Items(0, MAX_VIEW_SCOPES)] = ()


@dataclass(frozen=True)
class DepsShow(Request[DepsShowReply]):
    """One snapshot's manifest in a scope the caller may restore from (``""``: hers)."""

    op = "deps_show"
    timeout = 60.0
    scope: Name = ""
    key: Annotated[str, Text(1024, required=True, plain=True)] = ""
