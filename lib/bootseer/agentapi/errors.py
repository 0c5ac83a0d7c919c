"""The agent's error kinds: each kind one exception class, the same on both sides.

A failed request is answered ``{"ok": false, "error": MESSAGE, "kind": KIND}``; the client
raises the class of that kind, so a caller decides by class, never by message text:

    >>> error_for("pending", "/a.sqsh is being registered by another node")
    AgentPending('/a.sqsh is being registered by another node')
    >>> error_for("newer-kind", "x")  # an agent newer than its client
    AgentError('x')

Only the standard library here: a job's ``first_step`` mark imports it.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from bootseer.errors import BootseerError

ErrorKind = Literal[
    "failed", "unavailable", "timeout", "invalid", "refused", "not_found", "pending"
]


class AgentError(BootseerError):
    """The agent failed a request (the message says why); the base of the kinds below."""

    kind: ClassVar[ErrorKind] = "failed"


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


def error_reply(exc: AgentError) -> dict[str, object]:
    """The wire form of a failed request."""
    return {"ok": False, "error": str(exc), "kind": exc.kind}
