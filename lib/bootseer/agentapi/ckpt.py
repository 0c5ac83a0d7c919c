"""The checkpoint door's contract: ``bootseer ckpt`` requests a user sends the node agent.

A user holds no store credentials and no site key, so a user's ``bootseer ckpt`` asks
the node agent (root) over its unix socket, which knows the caller by ``SO_PEERCRED``
and acts only in that user's namespaces (``<user>/<NAMESPACE>``, the user name from
the uid, never from the request). The bytes of a ``put`` or ``get`` never travel in
the JSON line: the client opens the local file itself (the kernel checks its rights
there) and passes the descriptor with the request (``SCM_RIGHTS``); the agent reads or
writes that descriptor, never a path::

    {"op": "ckpt_put", "ns": "llama-25b", "path": "step100/model.pt"}   + a readable fd
    {"op": "ckpt_get", "ns": "llama-25b", "path": "step100/model.pt"}   + a writable fd
    {"op": "ckpt_ls", "ns": "llama-25b", "path": "step100"}
    {"op": "ckpt_rm", "ns": "llama-25b", "paths": ["step100/model.pt"]}
    {"op": "ckpt_verify", "ns": "llama-25b", "path": ""}
    {"op": "ckpt_usage", "ns": ""}                 the caller's stored bytes and quotas

Names are checked here, on the agent's side, before anything is opened
(:func:`bootseer.ckpt.namespace_name`, :func:`bootseer.ckpt.check_path`); lists are
bounded both ways (:data:`MAX_PATHS` in, :data:`MAX_ENTRIES` and
:data:`MAX_PROBLEMS` out). ``ckpt gc`` has no door: it is an admin's, run as root.

    >>> from bootseer.jsondecode import decode
    >>> decode(CkptGet, {"op": "ckpt_get", "ns": "llama-25b", "path": "a/b.pt"})
    CkptGet(ns='llama-25b', path='a/b.pt')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, ClassVar, Literal, Self, TypeVar

from bootseer.agentapi.wire import Reply, Request
from bootseer.jsondecode import Items, Text

MAX_NAME = 1024  # longer than any valid namespace (256) or path (1024 checked again)
MAX_PATHS = 1000  # files one ``rm`` may name
MAX_ENTRIES = 10000  # entries one ``ls`` answers with (it says when it left some out)
MAX_PROBLEMS = 1000  # problem lines one ``verify`` answers with

Name = Annotated[str, Text(MAX_NAME)]
RequiredName = Annotated[str, Text(MAX_NAME, required=True)]


# -- replies -----------------------------------------------------------------------


@dataclass(frozen=True)
class CkptPutReply(Reply):
    bytes: int
    version: str
    units: int


@dataclass(frozen=True)
class CkptGetReply(Reply):
    bytes: int
    version: str


@dataclass(frozen=True)
class CkptEntry:
    name: str
    is_dir: bool
    size: int = 0
    mtime: float = 0.0
    units: int = 0
    targets: int = 0
    version: str = ""


@dataclass(frozen=True)
class CkptListReply(Reply):
    entries: list[CkptEntry] = field(default_factory=list)
    left_out: int = 0  # entries past MAX_ENTRIES


@dataclass(frozen=True)
class CkptRemoveReply(Reply):
    removed: int


@dataclass(frozen=True)
class CkptVerifyReply(Reply):
    files: int
    bytes: int
    problems: list[str] = field(default_factory=list)
    more_problems: int = 0  # problems past MAX_PROBLEMS


ScopeKind = Literal["user", "account"]  # what a checkpoint quota bounds ([ckpt] quota's keys)


@dataclass(frozen=True)
class UsageRow:
    """One quota scope: a user's or an account's stored bytes and its quota (0: none)."""

    kind: ScopeKind
    name: str
    limit: int
    used: int


@dataclass(frozen=True)
class CkptUsageReply(Reply):
    scopes: list[UsageRow] = field(default_factory=list)


# -- requests ----------------------------------------------------------------------

C = TypeVar("C", bound=Reply)


@dataclass(frozen=True)
class CkptRequest(Request[C]):
    """A request in the caller's own namespace ``ns`` (the agent adds the user)."""

    ns: RequiredName
    fd_mode: ClassVar[Literal["", "r", "w"]] = ""  # the descriptor the request must carry
    timeout = None  # transfers: the agent bounds them itself


@dataclass(frozen=True)
class CkptPut(CkptRequest[CkptPutReply]):
    """Read the passed descriptor to its end and commit it as ``path``'s new version."""

    op = "ckpt_put"
    fd_mode = "r"
    path: RequiredName


@dataclass(frozen=True)
class CkptGet(CkptRequest[CkptGetReply]):
    """Write ``path``'s current version into the passed descriptor, from its offset on."""

    op = "ckpt_get"
    fd_mode = "w"
    path: RequiredName


@dataclass(frozen=True)
class CkptList(CkptRequest[CkptListReply]):
    op = "ckpt_ls"
    path: Name = ""


@dataclass(frozen=True)
class CkptRemove(CkptRequest[CkptRemoveReply]):
    op = "ckpt_rm"
    paths: Annotated[tuple[RequiredName, ...], Items(1, MAX_PATHS)]


@dataclass(frozen=True)
class CkptVerify(CkptRequest[CkptVerifyReply]):
    op = "ckpt_verify"
    path: Name = ""


@dataclass(frozen=True)
class CkptUsage(CkptRequest[CkptUsageReply]):
    """The caller's stored bytes on the targets against ``[ckpt] quota`` (no namespace)."""

    op = "ckpt_usage"
    ns: Name = ""

    def checked(self) -> Self:
        return type(self)()  # a namespace sent along means nothing here
