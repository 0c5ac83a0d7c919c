"""JSON into typed dataclasses: one decoder that reads a dataclass's field types.

Whatever bootseer reads as JSON from a place another party could have written (the
agent's socket, a record in the store, a file of a job's user) is decoded into the
dataclass that says what it must be, never used as a loose ``dict``: a missing field,
a wrong type or a value out of the bounds its type carries (``Annotated`` with
:class:`Bounds`, :class:`Text`, :class:`Items`) is a :class:`DecodeError` naming the
field, before anything acts on it.

    >>> @dataclass(frozen=True)
    ... class Block:
    ...     index: Annotated[int, Bounds(0)]
    ...     sha256: str
    ...     hot: bool = False
    >>> decode(Block, {"index": 3, "sha256": "ab", "extra": 1})
    Block(index=3, sha256='ab', hot=False)
    >>> decode(Block, {"index": -1, "sha256": "ab"})
    Traceback (most recent call last):
    ...
    bootseer.jsondecode.DecodeError: index must be at least 0, not -1

Only the standard library here: a job's ``first_step`` mark imports it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union


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
Seconds = Annotated[float, Bounds(0, above=True)]


# -- the decoder ---------------------------------------------------------------------

_HINTS: dict[type, dict[str, object]] = {}


def _hints(cls: type) -> dict[str, object]:
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
        args = typing.get_args(tp)
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            if len(value) != len(args):  # tuple[int, str]: so many, each of its type
                raise DecodeError(f"{name} must be a list of {len(args)} items")
            return tuple(
                decode(a, v, f"{name}[{i}]")
                for i, (a, v) in enumerate(zip(args, value, strict=True))
            )
        items = [decode(args[0], v, f"{name}[{i}]") for i, v in enumerate(value)]
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
    args: dict[str, object] = {}
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
