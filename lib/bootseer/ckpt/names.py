"""The names a checkpoint namespace takes: its own (``<user>/<name>``) and its files'.

Both become store keys, checked before anything reaches a target::

    >>> namespace_name("ada", "team/llama-25b"), check_path("step100/model.pt")
    ('ada/team/llama-25b', 'step100/model.pt')
    >>> check_path("../model.pt")
    Traceback (most recent call last):
    ...
    bootseer.ckpt.errors.CkptPathError: invalid checkpoint path '../model.pt': ...
"""

from __future__ import annotations

import re

from bootseer.ckpt.errors import CkptPathError
from bootseer.store import TMP_PREFIX
from bootseer.users import is_user_name

MAX_PATH = 1024
_PART = re.compile(r"[A-Za-z0-9._@+=:-]{1,255}")
_NS_PART = re.compile(r"[A-Za-z0-9._-]+")


def check_path(path: str) -> str:
    """``path`` if it is a safe relative file name in a namespace, else :class:`CkptPathError`."""
    parts = path.split("/")
    if (
        not path
        or len(path) > MAX_PATH
        or path.startswith("/")
        or any(
            p in (".", "..") or not _PART.fullmatch(p) or p.startswith(TMP_PREFIX) for p in parts
        )
    ):
        raise CkptPathError(
            f"invalid checkpoint path {path!r}: want a relative name of A-Z a-z 0-9 . _ @ + = : - "
            f"parts joined by '/', without '.', '..' or parts starting with {TMP_PREFIX!r}"
        )
    return path


def namespace_name(user: str, name: str) -> str:
    """``<user>/<name>``, refusing anything that could leave the user's part of the targets."""
    parts = name.split("/")
    if not is_user_name(user):
        raise CkptPathError(f"invalid user name {user!r} for a checkpoint namespace")
    if (
        not name
        or len(name) > 256
        or any(p in (".", "..") or not _NS_PART.fullmatch(p) for p in parts)
    ):
        raise CkptPathError(
            f"invalid checkpoint namespace {name!r}: a relative name of A-Z a-z 0-9 . _ - parts "
            "joined by '/', without '.' or '..'"
        )
    return f"{user}/{name}"
