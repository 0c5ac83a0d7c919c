"""JSON from anywhere a user might reach, parsed within limits: size first, depth next.

Root-run parts read back documents others could have written (a store users can write
to, a spool, a peer). ``json.loads`` reads any size and recurses once per nesting
level: ``[[[[...]]]]`` a hundred thousand deep raises :class:`RecursionError`, which no
parser here expected (it killed the ckpt FUSE daemon and broke every job of a shared
image). :func:`loads` refuses a document over ``max_bytes`` unread and one nested
deeper than ``max_depth`` before ``json.loads`` sees it, with :class:`JSONLimitError`,
a ``ValueError``, so every parser's existing ``except ValueError`` turns it into that
module's own error::

    >>> loads(b'{"a": [1, 2]}')
    {'a': [1, 2]}
    >>> loads(b"[" * 100 + b"]" * 100)
    Traceback (most recent call last):
    ...
    bootseer.jsonlimits.JSONLimitError: JSON nested deeper than 32 levels
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

MAX_DEPTH = 32  # bootseer's own documents nest 4 deep at most
MAX_BYTES = 1 << 20  # records, refs, traces of small images; callers pass their own

_STRING = re.compile(rb'"[^"]*"')  # once escaped backslashes and quotes are gone
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


class JSONLimitError(ValueError):
    """A document over the size or depth limit (a ``ValueError``: malformed, as far as
    any caller is concerned)."""


def depth(data: bytes) -> int:
    """How deep the arrays and objects of a JSON text nest (brackets in strings aside)."""
    if data.count(b"[") + data.count(b"{") == 0:
        return 0
    # Backslashes occur only in strings: drop each escaped backslash, then each escaped
    # quote (left to right, as a parser reads them); every quote left delimits a string.
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = _STRING.sub(b"", unescaped).translate(None, _NOT_BRACKETS)
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0)


def loads(
    data: bytes | bytearray | str,
    *,
    max_bytes: int = MAX_BYTES,
    max_depth: int = MAX_DEPTH,
    what: str = "JSON",
) -> Any:
    """``json.loads`` within ``max_bytes`` and ``max_depth``; JSONLimitError past them."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise JSONLimitError(f"{what} of {len(raw)} bytes is larger than {max_bytes}")
    if raw.count(b"[") + raw.count(b"{") > max_depth and depth(raw) > max_depth:
        raise JSONLimitError(f"{what} nested deeper than {max_depth} levels")
    try:
        return json.loads(raw)
    except RecursionError:  # the check above should make this unreachable
        raise JSONLimitError(f"{what} nested too deep to parse") from None
