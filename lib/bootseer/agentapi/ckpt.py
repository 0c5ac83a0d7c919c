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

    >>> parse_ckpt_request({"op": "ckpt_get", "ns": "llama-25b", "path": "a/b.pt"})
    CkptGet(ns='llama-25b', path='a/b.pt')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from bootseer.agentapi.protocol import AgentBadRequest, Reply, Request

MAX_NAME = 1024  # longer than any valid namespace (256) or path (1024 checked again)
MAX_PATHS = 1000  # files one ``rm`` may name
MAX_ENTRIES = 10000  # entries one ``ls`` answers with (it says when it left some out)
MAX_PROBLEMS = 1000  # problem lines one ``verify`` answers with


@dataclass(frozen=True)
class CkptRequest(Request):
    """A request in the caller's own namespace ``ns`` (the agent adds the user)."""

    ns: str
    fd_mode: ClassVar[str] = ""  # "r" or "w": the descriptor the request must carry


@dataclass(frozen=True)
class CkptPut(CkptRequest):
    """Read the passed descriptor to its end and commit it as ``path``'s new version."""

    op = "ckpt_put"
    fd_mode = "r"
    path: str = ""


@dataclass(frozen=True)
class CkptGet(CkptRequest):
    """Write ``path``'s current version into the passed descriptor, from its offset on."""

    op = "ckpt_get"
    fd_mode = "w"
    path: str = ""


@dataclass(frozen=True)
class CkptList(CkptRequest):
    op = "ckpt_ls"
    path: str = ""


@dataclass(frozen=True)
class CkptRemove(CkptRequest):
    op = "ckpt_rm"
    paths: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {"op": self.op, "ns": self.ns, "paths": list(self.paths)}


@dataclass(frozen=True)
class CkptVerify(CkptRequest):
    op = "ckpt_verify"
    path: str = ""


@dataclass(frozen=True)
class CkptUsage(CkptRequest):
    """The caller's stored bytes on the targets against ``[ckpt] quota`` (no namespace)."""

    op = "ckpt_usage"
    ns: str = ""


CKPT_REQUESTS: dict[str, type[CkptRequest]] = {
    cls.op: cls for cls in (CkptPut, CkptGet, CkptList, CkptRemove, CkptVerify, CkptUsage)
}


def _name(doc: dict[str, Any], key: str, required: bool) -> str:
    value = doc.get(key, "")
    if not isinstance(value, str) or len(value) > MAX_NAME:
        raise AgentBadRequest(f"{key} must be a string of at most {MAX_NAME} characters")
    if required and not value:
        raise AgentBadRequest(f"{key} is required")
    return value


def parse_ckpt_request(doc: dict[str, Any]) -> CkptRequest:
    """The typed request for a decoded line whose op starts with ``ckpt_``."""
    cls = CKPT_REQUESTS.get(doc.get("op", ""))
    if cls is None:
        raise AgentBadRequest(f"unknown op {doc.get('op')!r} (ops: {', '.join(CKPT_REQUESTS)})")
    ns = _name(doc, "ns", required=cls is not CkptUsage)
    if cls is CkptUsage:
        return CkptUsage()
    if cls is CkptRemove:
        paths = doc.get("paths")
        if not isinstance(paths, list) or not paths or len(paths) > MAX_PATHS:
            raise AgentBadRequest(f"paths must be a list of 1 to {MAX_PATHS} names")
        return CkptRemove(ns, tuple(_name({"p": p}, "p", required=True) for p in paths))
    path = _name(doc, "path", required=cls in (CkptPut, CkptGet))
    return cls(ns, path)  # type: ignore[call-arg]


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
    entries: list[dict[str, Any]] = field(default_factory=list)
    left_out: int = 0  # entries past MAX_ENTRIES

    def typed(self) -> list[CkptEntry]:
        return [CkptEntry(**e) for e in self.entries]


@dataclass(frozen=True)
class CkptRemoveReply(Reply):
    removed: int


@dataclass(frozen=True)
class CkptVerifyReply(Reply):
    files: int
    bytes: int
    problems: list[str] = field(default_factory=list)
    more_problems: int = 0  # problems past MAX_PROBLEMS


@dataclass(frozen=True)
class CkptUsageReply(Reply):
    """One row per quota scope (``kind``, ``name``, ``used``, ``limit``; 0: no quota)."""

    scopes: list[dict[str, Any]] = field(default_factory=list)
