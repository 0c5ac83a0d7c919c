"""Who may ask the agent what: authorisation and dispatch of one typed request.

The caller is known by ``SO_PEERCRED`` (:mod:`bootseer.agent.server`): root (the
prolog and epilog) may send every request; any other user may only ask ``status``
or ``first_step`` about a job of their own, and learns nothing of others' jobs (a
job of another user is "not found", exactly as a job that is not there); any user
may use the checkpoint door (``ckpt_*``) in their own namespaces, list the image
names (``image_ls``: published to every job user; path images are not listed), and
look at what is theirs to see in the store (``image_show``: a name and the traces her
jobs use; ``deps_ls``, ``deps_show``: the scopes her jobs restore from).

    >>> handle(agent, Status(42), peer_uid=1000)  # doctest: +SKIP
    JobReply(job_id=42, path='/run/bootseer/images/42.sqsh', ...)
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Sequence

from bootseer.agent.assembly import Agent
from bootseer.agent.jobs import JobView
from bootseer.agentapi.ckpt import CkptRequest
from bootseer.agentapi.protocol import (
    AgentBadRequest,
    AgentError,
    AgentNotFound,
    AgentRefused,
    AgentRestart,
    DepsList,
    DepsShow,
    FetchPiece,
    FirstStep,
    ImageList,
    ImageShow,
    ImageShowReply,
    JobRequest,
    Ping,
    PingReply,
    Prepare,
    Release,
    Reply,
    Request,
    Stats,
    Status,
)


def handle(
    agent: Agent,
    req: Request,
    peer_uid: int,
    fds: Sequence[int] = (),
    conn: socket.socket | None = None,
) -> Reply:
    """``fds``: the descriptors the caller passed (a checkpoint door's file); ``conn``:
    the caller's connection, watched while a long request runs."""
    if isinstance(req, CkptRequest):
        # Any user, in their own namespaces only (bootseer.ckpt.door).
        from bootseer.ckpt.door import Caller, current_config, serve
        from bootseer.sitekey import site_keys

        cfg = current_config(agent.cfg, agent.node)
        return serve(cfg, site_keys(cfg), req, Caller(peer_uid, list(fds), conn, agent.log))
    if isinstance(req, Ping):
        return PingReply(agent.node, os.getpid(), agent.started, os.path.realpath(sys.prefix))
    if isinstance(req, Stats):
        # The node's job list is root's; a user sees their own jobs and the totals.
        return agent.stats(None if peer_uid == 0 else peer_uid)
    if isinstance(req, ImageList):
        return agent.image_names()
    if isinstance(req, ImageShow | DepsList | DepsShow):
        return user_view(agent, req, peer_uid)
    if req.root_only and peer_uid != 0:
        raise AgentRefused(f"{req.op!r} is for root (the prolog/epilog) only")
    if isinstance(req, Status | FirstStep):
        view = own_job(agent, req, peer_uid)
        if isinstance(req, FirstStep):
            agent.jobs.first_step(view)
        return agent.jobs.describe(view)
    if isinstance(req, Prepare):
        return agent.jobs.describe(agent.jobs.prepare(req))
    if isinstance(req, Release):
        return agent.jobs.release(req.job_id)
    if isinstance(req, FetchPiece):
        return agent.fetch_piece(req)
    if isinstance(req, AgentRestart):
        if agent.handover is None:
            raise AgentError(f"the agent of {agent.node} cannot restart itself")
        return agent.handover.request(req.when_idle, own=1)
    raise AgentBadRequest(f"op {req.op!r} has no handler")


def user_view(agent: Agent, req: ImageShow | DepsList | DepsShow, peer_uid: int) -> Reply:
    """A user's look at the store, as that user (her name from her uid, never from her)."""
    import pwd

    from bootseer.sitekey import site_keys

    try:
        user = pwd.getpwuid(peer_uid).pw_name
    except KeyError:
        raise AgentRefused(f"uid {peer_uid} has no user name on {agent.node}") from None
    if isinstance(req, ImageShow):
        from bootseer.image.views import show_for_user

        return ImageShowReply(show_for_user(agent.store, site_keys(agent.cfg), req.ref, user))
    from bootseer.deps import views

    if isinstance(req, DepsList):
        return views.list_for(agent.store, agent.cfg, user, req.scopes)
    return views.show_for(agent.store, agent.cfg, site_keys(agent.cfg), user, req.scope, req.key)


def own_job(agent: Agent, req: JobRequest, peer_uid: int) -> JobView:
    view = agent.jobs.get(req.job_id)
    if view is None or (peer_uid != 0 and view.uid != peer_uid):
        # The same answer for "not yours" and "not here": no probing others' jobs.
        raise AgentNotFound(
            f"no prepared image for job {req.job_id} of uid {peer_uid} on {agent.node}"
        )
    return view
