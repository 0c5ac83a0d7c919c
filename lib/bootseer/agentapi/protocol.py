"""The node agent's socket contract: typed requests, typed replies, error kinds.

One connection carries one request and one reply, each a line of JSON. The server
(:mod:`bootseer.agent.server`) and the client (:mod:`bootseer.agentapi.client`) both
speak through this module, so the wire format lives in one place::

    {"op": "prepare", "job_id": 42, "uid": 1000, "gid": 1000, "image": "/shared/a.sqsh",
     "mode": "on", "deadline": 80}
    {"op": "first_step", "job_id": 42}
    {"op": "release", "job_id": 42}
    {"op": "status", "job_id": 42}  /  {"op": "stats"}  /  {"op": "ping"}
    {"op": "restart", "when_idle": true}
    {"op": "image_ls"}  /  {"op": "image_show", "ref": "pytorch:24.05"}
    {"op": "deps_ls", "scopes": ["user/alice"]}  /  {"op": "deps_show", "scope": "", "key": K}

A reply is ``{"ok": true, ...fields}`` or ``{"ok": false, "error": MESSAGE, "kind": KIND}``;
each kind is one exception class, so a caller decides by class, never by message text:

    >>> error_for("pending", "/a.sqsh is being registered by another node")
    AgentPending('/a.sqsh is being registered by another node')
    >>> parse_request({"op": "status", "job_id": 42})
    Status(job_id=42)

Only the standard library here: a job's ``first_step`` mark imports it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Self

from bootseer.errors import BootseerError, OptionError

MAX_LINE = 64 << 10  # a request longer than this is refused unread
MAX_JOB_ID = 2**40


# -- errors ------------------------------------------------------------------------


class AgentError(BootseerError):
    """The agent failed a request (the message says why); the base of the kinds below."""

    kind: ClassVar[str] = "failed"


class AgentUnavailable(AgentError):
    """No agent answers on the socket (not installed, not running, restarting)."""

    kind = "unavailable"


class AgentTimeout(AgentError):
    """The request did not finish in the time the caller gave it."""

    kind = "timeout"


class AgentBadRequest(AgentError):
    """The request is malformed: unknown op, missing or mistyped field."""

    kind = "invalid"


class AgentRefused(AgentError):
    """The caller may not do this (a user asking about another's job, or for a root-only
    op), or may not use this image (a file the job's user cannot read)."""

    kind = "refused"


class AgentNotFound(AgentError):
    """No such prepared job on this node, or no such registered image in the store."""

    kind = "not_found"


class AgentPending(AgentError):
    """Another node is still registering the path image; it is not ready yet."""

    kind = "pending"


ERRORS: dict[str, type[AgentError]] = {
    cls.kind: cls
    for cls in (
        AgentError,
        AgentUnavailable,
        AgentTimeout,
        AgentBadRequest,
        AgentRefused,
        AgentNotFound,
        AgentPending,
    )
}


def error_for(kind: object, message: str) -> AgentError:
    """The exception for an error reply; an unknown kind (a newer agent) is the base class."""
    return ERRORS.get(kind if isinstance(kind, str) else "", AgentError)(message)


def error_reply(exc: AgentError) -> dict[str, Any]:
    return {"ok": False, "error": str(exc), "kind": exc.kind}


# -- requests ----------------------------------------------------------------------


def _whole(value: object, name: str, low: int = 0, high: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise AgentBadRequest(f"{name} must be a whole number >= {low}, not {value!r}")
    if high is not None and value >= high:
        raise AgentBadRequest(f"{name} must be below {high}, not {value!r}")
    return value


@dataclass(frozen=True)
class Request:
    op: ClassVar[str]
    root_only: ClassVar[bool] = False  # only uid 0 (the prolog/epilog) may send it

    def to_wire(self) -> dict[str, Any]:
        return {"op": self.op, **asdict(self)}


@dataclass(frozen=True)
class Ping(Request):
    op = "ping"


@dataclass(frozen=True)
class Stats(Request):
    op = "stats"


@dataclass(frozen=True)
class AgentRestart(Request):
    """Restart in place (an upgrade, a new config): the agent runs its program again,
    from the install's ``venv`` link, once no job uses it (:mod:`bootseer.agent.handover`).
    ``when_idle``: while jobs use it, restart as soon as they are gone; else only now."""

    op = "restart"
    root_only = True
    when_idle: bool = True


@dataclass(frozen=True)
class ImageList(Request):
    """The registered image names (any user: a name is published to every job user)."""

    op = "image_ls"


@dataclass(frozen=True)
class ImageShow(Request):
    """One image name's manifest and the traces the caller's jobs of it use (any user: a
    name is published to every job user; a path or an image id is root's ``image show``)."""

    op = "image_show"
    ref: str


@dataclass(frozen=True)
class DepsList(Request):
    """The caller's snapshots in ``scopes`` (none: her user scope), each a scope she may
    restore from (:mod:`bootseer.deps.views`)."""

    op = "deps_ls"
    scopes: tuple[str, ...] = ()


@dataclass(frozen=True)
class DepsShow(Request):
    """One snapshot's manifest in a scope the caller may restore from (``""``: hers)."""

    op = "deps_show"
    scope: str
    key: str


MAX_VIEW_SCOPES = 64  # scopes one deps_ls names at most


@dataclass(frozen=True)
class JobRequest(Request):
    job_id: int


@dataclass(frozen=True)
class Status(JobRequest):
    op = "status"


@dataclass(frozen=True)
class FirstStep(JobRequest):
    """The job reached its first step: its block trace ends here."""

    op = "first_step"


@dataclass(frozen=True)
class Release(JobRequest):
    op = "release"
    root_only = True


@dataclass(frozen=True)
class Prepare(JobRequest):
    """Prepare ``image`` for the job of ``uid``/``gid``, within ``deadline`` seconds."""

    op = "prepare"
    root_only = True
    uid: int
    gid: int
    image: str  # the job's --bootseer-image, which parse_request checks (bootseer.options)
    mode: str = "on"  # or "refresh": ignore the stored trace
    deadline: float = 60.0
    nodelist: str = ""  # the job's nodes (Slurm's compact form): its peers


@dataclass(frozen=True)
class FetchPiece(JobRequest):
    """A piece outside any image (a snapshot frame: ``length`` bytes of store object
    ``key`` at ``offset``, with SHA-256 ``sha256``) for the job's prolog, through the
    job's peers; the agent answers with the cache file that holds it."""

    op = "piece"
    root_only = True
    nodelist: str
    key: str
    offset: int
    length: int
    sha256: str
    priority: int = 1
    target: str = ""  # a checkpoint target's URI; "" for the main store


REQUESTS: dict[str, type[Request]] = {
    cls.op: cls
    for cls in (
        Ping,
        Stats,
        ImageList,
        ImageShow,
        DepsList,
        DepsShow,
        Status,
        FirstStep,
        Release,
        Prepare,
        FetchPiece,
        AgentRestart,
    )
}


def parse_request(doc: object) -> Request:
    """The typed request for a decoded JSON line; :class:`AgentBadRequest` if malformed."""
    if not isinstance(doc, dict):
        raise AgentBadRequest("request must be a JSON object")
    op = doc.get("op")
    if isinstance(op, str) and op.startswith("ckpt_"):
        # The checkpoint door's requests (bootseer.agentapi.ckpt), on the same socket and caps.
        from bootseer.agentapi.ckpt import parse_ckpt_request

        return parse_ckpt_request(doc)
    cls = REQUESTS.get(op) if isinstance(op, str) else None
    if cls is None:
        raise AgentBadRequest(f"unknown op {op!r} (ops: {', '.join(REQUESTS)})")
    if cls is AgentRestart:
        when_idle = doc.get("when_idle", True)
        if not isinstance(when_idle, bool):
            raise AgentBadRequest("when_idle must be true or false")
        return AgentRestart(when_idle)
    if cls in (ImageShow, DepsList, DepsShow):
        return _view_request(cls, doc)
    if not issubclass(cls, JobRequest):
        return cls()
    job_id = doc.get("job_id")
    if not isinstance(job_id, int) or isinstance(job_id, bool) or not 0 < job_id < MAX_JOB_ID:
        raise AgentBadRequest("job_id must be a positive whole number")
    if cls is FetchPiece:
        nodelist, key, sha = doc.get("nodelist"), doc.get("key"), doc.get("sha256")
        target = doc.get("target", "")
        if not all(isinstance(v, str) for v in (nodelist, key, sha, target)):
            raise AgentBadRequest("nodelist, key, sha256 and target must be strings")
        assert isinstance(nodelist, str) and isinstance(key, str) and isinstance(sha, str)
        return FetchPiece(
            job_id,
            nodelist,
            key,
            _whole(doc.get("offset"), "offset"),
            _whole(doc.get("length"), "length", 1),
            sha,
            _whole(doc.get("priority", 1), "priority", 0, 3),
            str(target),
        )
    if cls is not Prepare:
        return cls(job_id)
    image, mode, deadline = doc.get("image"), doc.get("mode", "on"), doc.get("deadline", 60.0)
    uid, gid = _whole(doc.get("uid"), "uid"), _whole(doc.get("gid"), "gid")
    if not isinstance(image, str) or mode not in ("on", "refresh"):
        raise AgentBadRequest("image must be a string and mode on or refresh")
    # The job's option, checked here once for the whole agent as the prolog checked it
    # (bootseer.options): what passes may name a store key or a file.
    from bootseer.options import parse_image

    try:
        parse_image(image)
    except OptionError as exc:
        raise AgentBadRequest(str(exc)) from None
    if isinstance(deadline, bool) or not isinstance(deadline, int | float) or deadline <= 0:
        raise AgentBadRequest("deadline must be a positive number of seconds")
    nodelist = doc.get("nodelist", "")
    if not isinstance(nodelist, str):
        raise AgentBadRequest("nodelist must be a string")
    return Prepare(job_id, uid, gid, image, mode, float(deadline), nodelist)


def _text(value: object, name: str, limit: int = 1024) -> str:
    if not isinstance(value, str) or len(value) > limit or "\0" in value:
        raise AgentBadRequest(f"{name} must be a string of at most {limit} characters")
    return value


def _view_request(cls: type[Request], doc: dict[str, Any]) -> Request:
    """A user's look at the store; the values are checked again where they are used."""
    if cls is ImageShow:
        return ImageShow(_text(doc.get("ref"), "ref"))
    if cls is DepsShow:
        return DepsShow(_text(doc.get("scope", ""), "scope"), _text(doc.get("key"), "key"))
    scopes = doc.get("scopes", [])
    if not isinstance(scopes, list | tuple) or len(scopes) > MAX_VIEW_SCOPES:
        raise AgentBadRequest(f"scopes must be a list of at most {MAX_VIEW_SCOPES}")
    return DepsList(tuple(_text(s, "scope") for s in scopes))


def encode(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode() + b"\n"


# -- replies -----------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """A successful answer; ``to_wire`` adds ``"ok": true`` to its fields."""

    def to_wire(self) -> dict[str, Any]:
        return {"ok": True, **asdict(self)}

    @classmethod
    def from_wire(cls, doc: dict[str, Any]) -> Self:
        try:
            return cls(**{f.name: doc[f.name] for f in fields(cls) if f.name in doc})
        except TypeError as exc:  # a field the agent left out
            raise AgentError(f"node agent: bad {cls.__name__} reply: {exc}") from None


@dataclass(frozen=True)
class PingReply(Reply):
    node: str
    pid: int
    # When this agent's program started (a restart in place keeps the pid), and the
    # Python prefix it runs from (the install's venv it was started from, resolved):
    # an older agent leaves them out.
    started: float = 0.0
    prefix: str = ""


@dataclass(frozen=True)
class RestartReply(Reply):
    """``state``: ``restarting`` (the agent serves no job: it runs its program again, and
    requests wait for the new one), ``pending`` (it will once ``jobs`` are gone and no
    other request is open) or ``busy`` (``when_idle`` was false: nothing changes)."""

    state: str
    jobs: list[int]
    connections: int  # other requests of root's being served (a hook's)


@dataclass(frozen=True)
class JobReply(Reply):
    """What the agent knows of one prepared job (``status``, ``first_step``, ``prepare``)."""

    job_id: int
    path: str  # the job's lazy image file in the agent's FUSE mount
    image: str  # the image id (manifest digest)
    ref: str  # what the job asked for
    size: int
    block_size: int
    blocks: int
    trace_runs: int
    prefetch: dict[str, Any] | None  # PrefetchResult.as_dict()
    fill: dict[str, Any] | None  # BackgroundFill.as_dict()
    recorded_blocks: int
    first_step_at: float | None
    fetched_before_first_step: int | None
    # Where the job's blocks came from on this node (Swarm stats: store_bytes, peer_bytes,
    # peer_failures, corrupt), in all, by the prolog's return ("at_prepare") and when the
    # job's background fill started ("at_fill"; None before).
    peers: dict[str, Any] | None = None


@dataclass(frozen=True)
class PieceFile(Reply):
    """Where the agent keeps the verified piece (root reads it; verify again on read)."""

    path: str
    source: str  # cache, peer or store
    size: int


@dataclass(frozen=True)
class ReleaseReply(Reply):
    """``released`` is False when the agent had no image for the job."""

    released: bool
    trace: str | None = None  # what became of the trace: saved, merged, unchanged, ...
    job: JobReply | None = None

    def to_wire(self) -> dict[str, Any]:
        job = self.job.to_wire() if self.job else {}
        return {**job, "ok": True, "released": self.released, "trace": self.trace}

    @classmethod
    def from_wire(cls, doc: dict[str, Any]) -> ReleaseReply:
        released = bool(doc.get("released"))
        job = JobReply.from_wire(doc) if released else None
        trace = doc.get("trace")
        return cls(released, trace if isinstance(trace, str) else None, job)


@dataclass(frozen=True)
class ImageListReply(Reply):
    """The names a job may ask for, each ``{"name", "image", "size", "added"}``; how many
    more there were than the agent lists (``left_out``)."""

    images: list[dict[str, Any]]
    left_out: int = 0


@dataclass(frozen=True)
class ImageShowReply(Reply):
    """``bootseer image show``'s document: the image's id, size, blocks, its name's
    ``trace_owner``, and ``traces`` by user (the caller's and the trace owner's only)."""

    doc: dict[str, Any]


@dataclass(frozen=True)
class DepsListReply(Reply):
    """The snapshots of the scopes listed, each ``{"scope", "key", "size", "created",
    "last_used"}`` (``bootseer.deps.gc.SnapshotInfo``)."""

    snapshots: list[dict[str, Any]]
    scopes: list[str]


@dataclass(frozen=True)
class DepsShowReply(Reply):
    """The snapshot's manifest as stored (``bootseer.deps.manifest.Manifest.to_json``),
    verified by the agent, and its size in the store."""

    manifest: str
    size: int


@dataclass(frozen=True)
class StatsReply(Reply):
    node: str
    jobs: list[int]
    cache_bytes: int
    cache_blocks: int
    cache_cap: int
    evicted: int
    fetched_blocks: int
    fetched_bytes: int
    demand_bytes: int
    prefetch_bytes: int
    background_bytes: int
    corrupt_refused: int
    fetch_errors: int
    connections: int = 0  # requests the socket is serving (a user: her own), this one too
