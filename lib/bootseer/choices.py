"""Closed sets of words: a value from outside becomes one of a ``Literal``'s members.

A closed set (a step's outcome, the hook, a job's mode) is a ``Literal`` type with a
tuple of its members beside it; a string read from argv, a file or the wire becomes
that type only by matching one of them::

    >>> from typing import Literal
    >>> Hook = Literal["prolog", "epilog"]
    >>> HOOKS: tuple[Hook, ...] = ("prolog", "epilog")
    >>> one_of("epilog", HOOKS)
    'epilog'
    >>> one_of("teardown", HOOKS) is None
    True
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def one_of(value: object, members: tuple[T, ...]) -> T | None:
    """The member of ``members`` that ``value`` equals, or None."""
    for member in members:
        if value == member:
            return member
    return None
