"""Requests and replies as typed dataclasses, and the one function that decodes them.

One connection carries one request and one reply, each a line of JSON. A request is a
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
    bootseer.agentapi.wire.DecodeError: times must be at least 1, not 0

A reply is ``{"ok": true, ...fields}``; an error reply is
:func:`bootseer.agentapi.errors.error_reply`. Only the standard library here: a job's
``first_step`` mark imports it.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import asdict, dataclass
from typing import Annotated, Any, ClassVar, Generic, Literal, Self, TypeVar, Union

MAX_LINE = 64 << 10  # a request longer than this is refused unread
MAX_JOB_ID = 2**40


class DecodeError(ValueError):
    """A field is missing, of the wrong type or out of its bounds (the message names it)."""


# -- bounds a field's type carries -------------------------------------------------


@dataclass(frozen=True)
class Bounds:
    """A number from ``low`` up to (excluding) ``high``; ``above``: strictly above ``low``."""

    low: float | None = None
    high: float | None = None
    above: bool = False

    def check(self, value: float, name: str) -> None:
        if self.low is not None and (value <= self.low if self.above else value < self.low):
            rel = "above" if self.above else "at least"
            raise DecodeError(f"{name} must be {rel} {self.low:g}, not {value!r}")
        if self.high is not None and value >= self.high:
            raise DecodeError(f"{name} must be below {self.high:g}, not {value!r}")


@dataclass(frozen=True)
class Text:
    """A string of at most ``limit`` characters; ``required``: not empty; ``plain``: no NUL."""

    limit: int = 1024
    required: bool = False
    plain: bool = False

    def check(self, value: str, name: str) -> None:
        if len(value) > self.limit:
            raise DecodeError(f"{name} must be a string of at most {self.limit} characters")
        if self.required and not value:
            raise DecodeError(f"{name} is required")
        if self.plain and "\0" in value:
            raise DecodeError(f"{name} must not hold a NUL character")


@dataclass(frozen=True)
class Items:
    """A list of ``low`` to ``high`` items."""

    low: int = 0
    high: int = 1000

    def check(self, value: tuple[object, ...] | list[object], name: str) -> None:
        if not self.low <= len(value) <= self.high:
            raise DecodeError(f"{name} must be a list of {self.low} to {self.high} items")


Whole = Annotated[int, Bounds(0)]
JobId = Annotated[int, Bounds(1, MAX_JOB_ID)]
Seconds = Annotated[float, Bounds(0, above=True)]


# -- the decoder ---------------------------------------------------------------------

_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls, include_extras=True)
    return _HINTS[cls]


def decode(tp: Any, value: object, name: str = "value") -> Any:
    """``value`` (decoded JSON) as type ``tp``: a dataclass from an object (unknown keys
    ignored, missing ones their defaults), ``int`` (never a bool), ``float`` (an int too),
    ``str``, ``bool``, ``Literal``, ``X | None``, ``list``/``tuple[X, ...]`` from a list,
    ``dict[str, X]``, and the bounds of ``Annotated``; :class:`DecodeError` otherwise."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        base, *marks = typing.get_args(tp)
        out = decode(base, value, name)
        for mark in marks:
            mark.check(out, name)
        return out
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _decode_dataclass(tp, value, name, prefix="")
    if tp is Any or tp is object:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise DecodeError(f"{name} must be true or false, not {value!r}")
        return value
    if tp is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise DecodeError(f"{name} must be a whole number, not {value!r}")
        return value
    if tp is float:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise DecodeError(f"{name} must be a number, not {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise DecodeError(f"{name} must be a string, not {type(value).__name__}")
        return value
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices or isinstance(value, bool):
            raise DecodeError(f"{name} must be one of {', '.join(map(str, choices))}")
        return value
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        others = [a for a in args if a is not type(None)]
        if len(others) == 1:
            return decode(others[0], value, name)
        raise TypeError(f"{name}: no decoder for the union {tp!r}")
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise DecodeError(f"{name} must be a list, not {type(value).__name__}")
        item = typing.get_args(tp)[0]
        items = [decode(item, v, f"{name}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise DecodeError(f"{name} must be an object, not {type(value).__name__}")
        _, item = typing.get_args(tp)
        return {str(k): decode(item, v, f"{name}.{k}") for k, v in value.items()}
    raise TypeError(f"{name}: no decoder for {tp!r}")


def _decode_dataclass(cls: type, value: object, name: str, prefix: str) -> Any:
    """``prefix``: what a field's name is qualified with in an error (``fill.state``)."""
    if not isinstance(value, dict):
        raise DecodeError(f"{name} must be a JSON object")
    hints = _hints(cls)
    args: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.name in value:
            args[f.name] = _field(hints[f.name], value[f.name], prefix + f.name)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise DecodeError(f"{prefix}{f.name} is required")
    return cls(**args)


def _field(tp: Any, value: object, name: str) -> Any:
    """A field's value: a dataclass inside a dataclass names its fields ``name.field``."""
    base = typing.get_args(tp)[0] if typing.get_origin(tp) is Annotated else tp
    inner = [base]
    if typing.get_origin(base) in (Union, types.UnionType):  # X | None
        inner = [a for a in typing.get_args(base) if a is not type(None)]
    if value is not None and len(inner) == 1 and dataclasses.is_dataclass(inner[0]):
        return _decode_dataclass(inner[0], value, name, prefix=name + ".")  # type: ignore[arg-type]
    return decode(tp, value, name)


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
