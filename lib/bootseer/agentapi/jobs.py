"""The agent's own requests: liveness, totals, restarts, and the jobs it prepares.

{"op": "prepare", "job_id": 42, "uid": 1000, "gid": 1000, "image": "/shared/a.sqsh",
 "mode": "on", "deadline": 80}
{"op": "first_step", "job_id": 42}
{"op": "release", "job_id": 42}
{"op": "status", "job_id": 42}  /  {"op": "stats"}  /  {"op": "ping"}
{"op": "restart", "when_idle": true}
{"op": "piece", "job_id": 42, "nodelist": "n[1-4]", "key": K, "offset": 0, ...}

>>> decode(Status, {"op": "status", "job_id": 42})
Status(job_id=42)
>>> Status.reply.__name__, Status.root_only, Prepare.root_only
('JobReply', False, True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal, Self, TypeVar

from bootseer.agentapi.wire import JobId, Reply, Request
from bootseer.jsondecode import Bounds, DecodeError, Seconds, Whole, decode

# -- replies -------------------------------------------------------------------------


@dataclass(frozen=True)
class PingReply(Reply):
    node: str
    pid: int
    # When this agent's program started (a restart in place keeps the pid), and the
    # Python prefix it runs from (the install's venv it was started from, resolved):
    # an older agent leaves them out.
    started: float = 0.0
    prefix: str = ""


RestartState = Literal["restarting", "pending", "busy"]


@dataclass(frozen=True)
class RestartReply(Reply):
    """``state``: ``restarting`` (the agent serves no job: it runs its program again, and
    requests wait for the new one), ``pending`` (it will once ``jobs`` are gone and no
    other request is open) or ``busy`` (``when_idle`` was false: nothing changes)."""

    state: RestartState
    jobs: list[int]
    connections: int  # other requests of root's being served (a hook's)


@dataclass(frozen=True)
class PrefetchSummary:
    """What the prolog's prefetch of a job's hot blocks did (``image.prefetch``)."""

    hot_blocks: int = 0
    hot_bytes: int = 0
    local_before: int = 0  # already in the node's cache
    fetched_blocks: int = 0
    fetched_bytes: int = 0
    failed: int = 0
    complete: bool = True  # every hot block local before the deadline
    seconds: float = 0.0
    hit_ratio: float = 1.0
    pending: int = 0  # hot blocks still on their way, now (an agent before: 0)


FillState = Literal["running", "done", "cancelled"]


@dataclass(frozen=True)
class FillSummary:
    """The job's background fill of its image's other blocks (``image.prefetch``)."""

    state: FillState
    start: float | None
    end: float | None
    blocks: int
    done: int
    failed: int
    bytes: int


@dataclass(frozen=True)
class ByteCounts:
    """A job's image bytes on this node by where they came from."""

    store_bytes: int = 0
    peer_bytes: int = 0


@dataclass(frozen=True)
class PeerSummary(ByteCounts):
    """Where the job's blocks came from on this node, in all (the inherited counts), by
    the prolog's return (``at_prepare``) and when its fill started (``at_fill``)."""

    peer_failures: int = 0
    corrupt: int = 0
    dropped: dict[str, str] = field(default_factory=dict)  # node -> why it was dropped
    at_prepare: ByteCounts | None = None
    at_fill: ByteCounts | None = None


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
    prefetch: PrefetchSummary | None
    fill: FillSummary | None
    recorded_blocks: int
    first_step_at: float | None
    fetched_before_first_step: int | None
    peers: PeerSummary | None = None  # None: the job's blocks came from its origin only


PieceSource = Literal["cache", "peer", "store"]  # where a piece came from


@dataclass(frozen=True)
class PieceFile(Reply):
    """Where the agent keeps the verified piece (root reads it; verify again on read):
    ``size`` bytes at ``offset`` of the file ``path`` (a cache pack; "": the agent's disk
    did not take it). ``offset`` None: an agent from before, whose file was the piece's
    alone. ``passed``: the file came with the reply, opened (``SCM_RIGHTS``), with the
    CRC-32C of each 32 KiB the agent recorded when it verified the piece
    (:class:`~bootseer.image.cache.BlockCache`): the caller checks what it reads against
    those, not the digest again."""

    path: str
    source: PieceSource
    size: int
    passed: bool = False
    crcs: tuple[int, ...] = ()
    offset: int | None = None


@dataclass(frozen=True)
class ReleaseReply(Reply):
    """``released`` is False when the agent had no image for the job. On the wire the
    job's fields stand beside ``released`` and ``trace`` (as older agents sent them)."""

    released: bool
    trace: str | None = None  # what became of the trace: saved, merged, unchanged, ...
    job: JobReply | None = None

    def to_wire(self) -> dict[str, object]:
        job = self.job.to_wire() if self.job else {}
        return {**job, "ok": True, "released": self.released, "trace": self.trace}

    @classmethod
    def from_wire(cls, doc: object) -> Self:
        if not isinstance(doc, dict):
            raise DecodeError("ReleaseReply must be a JSON object")
        released = decode(bool, doc.get("released", False), "released")
        trace = decode(str | None, doc.get("trace"), "trace")
        return cls(released, trace, JobReply.from_wire(doc) if released else None)


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
    # Reads of the jobs' image files that reached the agent (FUSE requests) and their
    # bytes; pages the kernel holds are served without the agent (a re-read adds none).
    read_requests: int = 0
    read_bytes: int = 0


# -- requests ------------------------------------------------------------------------


@dataclass(frozen=True)
class Ping(Request[PingReply]):
    op = "ping"


@dataclass(frozen=True)
class Stats(Request[StatsReply]):
    """The agent's totals (a user sees her own jobs in the job list)."""

    op = "stats"


@dataclass(frozen=True)
class AgentRestart(Request[RestartReply]):
    """Restart in place (an upgrade, a new config): the agent runs its program again,
    from the install's ``venv`` link, once no job uses it (:mod:`bootseer.agent.handover`).
    ``when_idle``: while jobs use it, restart as soon as they are gone; else only now."""

    op = "restart"
    root_only = True
    timeout = 60.0
    when_idle: bool = True


J = TypeVar("J", bound=Reply)


@dataclass(frozen=True)
class JobRequest(Request[J]):
    """A request about one job on this node."""

    job_id: JobId


@dataclass(frozen=True)
class Status(JobRequest[JobReply]):
    op = "status"


@dataclass(frozen=True)
class FirstStep(JobRequest[JobReply]):
    """The job reached its first step: its block trace ends here."""

    op = "first_step"


@dataclass(frozen=True)
class Release(JobRequest[ReleaseReply]):
    op = "release"
    root_only = True


Mode = Literal["on", "refresh"]


@dataclass(frozen=True)
class Prepare(JobRequest[JobReply]):
    """Prepare ``image`` for the job of ``uid``/``gid``, within ``deadline`` seconds."""

    op = "prepare"
    root_only = True
    uid: Whole
    gid: Whole
    image: str  # the job's --bootseer-image, checked as the prolog checked it
    mode: Mode = "on"  # "refresh": ignore the stored trace
    deadline: Seconds = 60.0
    nodelist: str = ""  # the job's nodes (Slurm's compact form): its peers

    def checked(self) -> Self:
        # The job's option, checked here once for the whole agent as the prolog checked
        # it (bootseer.options): what passes may name a store key or a file.
        from bootseer.errors import OptionError
        from bootseer.options import parse_image

        try:
            parse_image(self.image)
        except OptionError as exc:
            raise DecodeError(str(exc)) from None
        return self


@dataclass(frozen=True)
class FetchPiece(JobRequest[PieceFile]):
    """A piece outside any image (a snapshot frame: ``length`` bytes of store object
    ``key`` at ``offset``, with digest ``digest``, :mod:`bootseer.digest`) for the job's
    prolog or checkpoint daemon, through the job's peers (none named: a one-node job's,
    from the store); the agent answers with where its cache holds it (a
    pack, an offset). The field was ``sha256`` before BLAKE3: an agent of that release
    refuses this request (a field missing) and the asker reads the store itself."""

    op = "piece"
    root_only = True
    nodelist: str
    key: str
    offset: Whole
    length: Annotated[int, Bounds(1)]
    digest: str
    priority: Annotated[int, Bounds(0, 3)] = 1
    target: str = ""  # a checkpoint target's URI; "" for the main store
    # Whose the job is, from the prolog's Slurm environment (-1: not said): the agent
    # serves the job's peers only pieces of its scopes, and need not ask Slurm.
    uid: Annotated[int, Bounds(-1, 1 << 32)] = -1
    account: str = ""
    # Pass the cache's pack, opened, with the reply, and the piece's CRCs (an agent from
    # before ignores this and names the file alone).
    pass_file: bool = False

    def checked(self) -> Self:
        from bootseer.digest import split

        try:
            split(self.digest)
        except ValueError as exc:
            raise DecodeError(f"digest: {exc}") from None
        return self
