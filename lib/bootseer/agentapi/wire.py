"""Requests and replies as typed dataclasses, decoded by :mod:`bootseer.jsondecode`.

A request and its reply are each a line of JSON; a connection carries requests one
after another, each answered before the next is sent (an agent of an earlier version
answers one and closes: the client then opens one per request). A request is a
frozen dataclass naming its ``op`` and, as its type parameter, its reply type; the
decoder reads the dataclass's field types (and the bounds they carry in ``Annotated``),
so a new request is declared once and needs no parse code of its own:

    >>> @dataclass(frozen=True)
    ... class Echo(Request["EchoReply"]):
    ...     op = "echo"
    ...     times: Annotated[int, Bounds(1, 10)] = 1
    >>> decode(Echo, {"op": "echo", "times": 3})
    Echo(times=3)
    >>> decode(Echo, {"op": "echo", "times": 0})
    Traceback (most recent call last):
    ...
    bootseer.jsondecode.DecodeError: times must be at least 1, not 0

A reply is ``{"ok": true, ...fields}``; an error reply is
:func:`bootseer.agentapi.errors.error_reply`. Only the standard library here: a job's
``first_step`` mark imports it.
"""

from __future__ import annotations

import json
import typing
from dataclasses import asdict, dataclass
from typing import Annotated, Any, ClassVar, Generic, Self, TypeVar

from bootseer.jsondecode import Bounds, decode

MAX_LINE = 64 << 10  # a request longer than this is refused unread
MAX_JOB_ID = 2**40
JobId = Annotated[int, Bounds(1, MAX_JOB_ID)]


# -- requests and replies ------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """A successful answer; ``to_wire`` adds ``"ok": true`` to its fields."""

    def to_wire(self) -> dict[str, object]:
        return {"ok": True, **asdict(self)}

    @classmethod
    def from_wire(cls, doc: object) -> Self:
        """The reply in ``doc``; :class:`DecodeError` if the agent sent something else."""
        out: Self = decode(cls, doc, cls.__name__)
        return out


R = TypeVar("R", bound=Reply)


@dataclass(frozen=True)
class Request(Generic[R]):
    """One request: its ``op`` on the wire, who may send it, its reply type (the type
    parameter) and how long a caller waits for it by default."""

    op: ClassVar[str]
    root_only: ClassVar[bool] = False  # only uid 0 (the prolog/epilog) may send it
    # Seconds a caller waits unless it says otherwise; None: as long as the agent works.
    timeout: ClassVar[float | None] = 10.0
    reply: ClassVar[type[Reply]] = Reply

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in cls.__dict__.get("__orig_bases__", ()):
            for arg in typing.get_args(base):
                if isinstance(arg, type) and issubclass(arg, Reply):
                    cls.reply = arg

    def to_wire(self) -> dict[str, object]:
        return {"op": self.op, **asdict(self)}

    def checked(self) -> Self:
        """The request after the checks its field types cannot say (the agent calls it
        once decoded); :class:`DecodeError` if it fails them."""
        return self


def encode(doc: dict[str, object]) -> bytes:
    return json.dumps(doc).encode() + b"\n"
