"""Every request the agent answers, by its ``op``: the one table both sides read.

A new request is a dataclass in its family's module (:mod:`~bootseer.agentapi.jobs`,
:mod:`~bootseer.agentapi.views`, :mod:`~bootseer.agentapi.ckpt`), listed here, and
given a handler in :data:`bootseer.agent.handler.HANDLERS` (a test fails until both are
there). Its parse code is its field types (:func:`bootseer.agentapi.wire.decode`).

    >>> parse_request({"op": "status", "job_id": 42})
    Status(job_id=42)
    >>> parse_request({"op": "status", "job_id": True})
    Traceback (most recent call last):
    ...
    bootseer.agentapi.errors.AgentBadRequest: status: job_id must be a whole number, not True
"""

from __future__ import annotations

from typing import Any

from bootseer.agentapi.ckpt import CkptGet, CkptList, CkptPut, CkptRemove, CkptUsage, CkptVerify
from bootseer.agentapi.errors import AgentBadRequest
from bootseer.agentapi.jobs import (
    AgentRestart,
    FetchPiece,
    FirstStep,
    Ping,
    Prepare,
    Release,
    Stats,
    Status,
)
from bootseer.agentapi.views import DepsList, DepsShow, ImageList, ImageShow
from bootseer.agentapi.wire import Request
from bootseer.jsondecode import DecodeError, decode

REQUESTS: dict[str, type[Request[Any]]] = {
    cls.op: cls
    for cls in (
        Ping,
        Stats,
        AgentRestart,
        Status,
        FirstStep,
        Release,
        Prepare,
        FetchPiece,
        ImageList,
        ImageShow,
        DepsList,
        DepsShow,
        CkptPut,
        CkptGet,
        CkptList,
        CkptRemove,
        CkptVerify,
        CkptUsage,
    )
}


def parse_request(doc: object) -> Request[Any]:
    """The typed request for a decoded JSON line; :class:`AgentBadRequest` if malformed."""
    if not isinstance(doc, dict):
        raise AgentBadRequest("request must be a JSON object")
    op = doc.get("op")
    cls = REQUESTS.get(op) if isinstance(op, str) else None
    if cls is None:
        raise AgentBadRequest(f"unknown op {op!r} (ops: {', '.join(REQUESTS)})")
    try:
        request: Request[Any] = decode(cls, doc, str(op)).checked()
    except DecodeError as exc:
        raise AgentBadRequest(f"{op}: {exc}") from None
    return request
