"""Who may ask the agent what: one handler per request type, in one table.

The caller is known by ``SO_PEERCRED`` (:mod:`bootseer.agent.server`): root (the
prolog and epilog) may send every request; any other user may only ask ``status``
or ``first_step`` about a job of their own, and learns nothing of others' jobs (a
job of another user is "not found", exactly as a job that is not there); any user
may use the checkpoint door (``ckpt_*``) in their own namespaces (where the site's
``[ckpt] door`` lets them: by default with a job on the node), list the image
names (``image_ls``: published to every job user; path images are not listed), and
look at what is theirs to see in the store (``image_show``: a name and the traces her
jobs use; ``deps_ls``, ``deps_show``: the scopes her jobs restore from). A request
marked ``root_only`` is refused to every other user before its handler runs.

    >>> handle(agent, Status(42), Caller(1000))  # doctest: +SKIP
    JobReply(job_id=42, path='/run/bootseer/images/42.sqsh', ...)
"""

from __future__ import annotations

import os
import pwd
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from bootseer.agent.assembly import Agent
from bootseer.agent.jobs import JobView
from bootseer.agentapi.ckpt import (
    CkptGet,
    CkptList,
    CkptPut,
    CkptRemove,
    CkptRequest,
    CkptUsage,
    CkptVerify,
)
from bootseer.agentapi.errors import AgentBadRequest, AgentError, AgentNotFound, AgentRefused
from bootseer.agentapi.jobs import (
    AgentRestart,
    FetchPiece,
    FirstStep,
    JobReply,
    JobRequest,
    PieceFile,
    Ping,
    PingReply,
    Prepare,
    Release,
    ReleaseReply,
    RestartReply,
    Stats,
    StatsReply,
    Status,
)
from bootseer.agentapi.views import (
    DepsList,
    DepsListReply,
    DepsShow,
    DepsShowReply,
    ImageList,
    ImageListReply,
    ImageShow,
    ImageShowReply,
)
from bootseer.agentapi.wire import Reply, Request


@dataclass
class Caller:
    """Who asks (by ``SO_PEERCRED``), the descriptors they passed (a checkpoint door's
    file) and their connection, watched while a long request runs."""

    uid: int
    fds: Sequence[int] = field(default_factory=list)
    conn: socket.socket | None = None
    # Descriptors sent back with the reply (a piece's sealed memory file); the server
    # closes them once sent.
    reply_fds: list[int] = field(default_factory=list)


Q = TypeVar("Q", bound=Request[Any])
Handler = Callable[[Agent, Any, Caller], Reply]
HANDLERS: dict[type[Request[Any]], Handler] = {}


def handles(*types: type[Q]) -> Callable[[Callable[[Agent, Q, Caller], Reply]], Handler]:
    """Register the decorated function as the handler of ``types``."""

    def register(fn: Callable[[Agent, Q, Caller], Reply]) -> Handler:
        for t in types:
            HANDLERS[t] = fn
        return fn

    return register


def handle(agent: Agent, req: Request[Any], caller: Caller) -> Reply:
    """The reply to ``req`` from ``caller``; an :class:`AgentError` kind for a refusal."""
    if req.root_only and caller.uid != 0:
        raise AgentRefused(f"{req.op!r} is for root (the prolog/epilog) only")
    handler = HANDLERS.get(type(req))
    if handler is None:
        raise AgentBadRequest(f"op {req.op!r} has no handler")
    return handler(agent, req, caller)


@handles(Ping)
def _ping(agent: Agent, req: Ping, caller: Caller) -> PingReply:
    return PingReply(agent.node, os.getpid(), agent.started, os.path.realpath(sys.prefix))


@handles(Stats)
def _stats(agent: Agent, req: Stats, caller: Caller) -> StatsReply:
    # The node's job list is root's; a user sees their own jobs and the totals.
    return agent.stats(None if caller.uid == 0 else caller.uid)


@handles(AgentRestart)
def _restart(agent: Agent, req: AgentRestart, caller: Caller) -> RestartReply:
    if agent.handover is None:
        raise AgentError(f"the agent of {agent.node} cannot restart itself")
    return agent.handover.request(req.when_idle, own=1)


@handles(Status)
def _status(agent: Agent, req: Status, caller: Caller) -> JobReply:
    return agent.jobs.describe(own_job(agent, req, caller.uid))


@handles(FirstStep)
def _first_step(agent: Agent, req: FirstStep, caller: Caller) -> JobReply:
    view = own_job(agent, req, caller.uid)
    agent.jobs.first_step(view)
    return agent.jobs.describe(view)


@handles(Prepare)
def _prepare(agent: Agent, req: Prepare, caller: Caller) -> JobReply:
    return agent.jobs.describe(agent.jobs.prepare(req))


@handles(Release)
def _release(agent: Agent, req: Release, caller: Caller) -> ReleaseReply:
    return agent.jobs.release(req.job_id)


@handles(FetchPiece)
def _piece(agent: Agent, req: FetchPiece, caller: Caller) -> PieceFile:
    reply, fd = agent.fetch_piece(req)
    if fd is not None:
        caller.reply_fds.append(fd)
    return reply


@handles(ImageList)
def _image_ls(agent: Agent, req: ImageList, caller: Caller) -> ImageListReply:
    return agent.image_names()


@handles(ImageShow)
def _image_show(agent: Agent, req: ImageShow, caller: Caller) -> ImageShowReply:
    from bootseer.image.views import show_for_user
    from bootseer.sitekey import site_keys

    user = user_name(agent, caller.uid)
    return ImageShowReply(show_for_user(agent.store, site_keys(agent.cfg), req.ref, user))


@handles(DepsList)
def _deps_ls(agent: Agent, req: DepsList, caller: Caller) -> DepsListReply:
    from bootseer.deps import views

    return views.list_for(agent.store, agent.cfg, user_name(agent, caller.uid), req.scopes)


@handles(DepsShow)
def _deps_show(agent: Agent, req: DepsShow, caller: Caller) -> DepsShowReply:
    from bootseer.deps import views
    from bootseer.sitekey import site_keys

    user = user_name(agent, caller.uid)
    return views.show_for(agent.store, agent.cfg, site_keys(agent.cfg), user, req.scope, req.key)


@handles(CkptPut, CkptGet, CkptList, CkptRemove, CkptVerify, CkptUsage)
def _ckpt(agent: Agent, req: Any, caller: Caller) -> Reply:
    # Any user, in their own namespaces only (bootseer.ckpt.door).
    from bootseer.ckpt import door
    from bootseer.sitekey import site_keys

    cfg = door.current_config(agent.cfg, agent.node)
    door.admit(cfg, agent.node, caller.uid, {v.uid for v in agent.jobs.views()})
    who = door.Caller(caller.uid, list(caller.fds), caller.conn, agent.log)
    request: CkptRequest[Any] = req
    return door.serve(cfg, site_keys(cfg), request, who)


def user_name(agent: Agent, uid: int) -> str:
    """The caller's user name, from her uid (never from her request)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        raise AgentRefused(f"uid {uid} has no user name on {agent.node}") from None


def own_job(agent: Agent, req: JobRequest[Any], peer_uid: int) -> JobView:
    view = agent.jobs.get(req.job_id)
    if view is None or (peer_uid != 0 and view.uid != peer_uid):
        # The same answer for "not yours" and "not here": no probing others' jobs.
        raise AgentNotFound(
            f"no prepared image for job {req.job_id} of uid {peer_uid} on {agent.node}"
        )
    return view
