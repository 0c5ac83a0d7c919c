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

from bootseer.ckpt.errors import CkptLinkAbsolute, CkptLinkEscapes, CkptPathError
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


MAX_LINK = 1024


def check_link_text(target: str) -> str:
    """``target`` if it can be a link's target at all: relative, of valid parts or
    ``.``/``..`` (where it leads is :func:`check_link`'s)."""
    parts = target.split("/")
    if (
        not target
        or len(target) > MAX_LINK
        or target.startswith("/")
        or any(p not in (".", "..", "") and not _PART.fullmatch(p) for p in parts)
    ):
        raise CkptPathError(
            f"invalid symlink target {target!r}: want a relative name inside the namespace"
        )
    return target


def link_destination(path: str, target: str) -> str | None:
    """Where a link at ``path`` pointing at ``target`` leads, relative to the namespace's
    root ("" the root itself), or None when it leaves the namespace."""
    out = path.split("/")[:-1]
    for p in target.split("/"):
        if p in ("", "."):
            continue
        if p == "..":
            if not out:
                return None
            out.pop()
        else:
            out.append(p)
    return "/".join(out)


def check_link(path: str, target: str) -> str:
    """``target`` if a link at ``path`` may point at it: relative, and not leaving the
    namespace (an absolute target is :class:`CkptLinkAbsolute`, one that climbs out
    :class:`CkptLinkEscapes`)."""
    if target.startswith("/"):
        raise CkptLinkAbsolute(
            f"symlink {path!r} -> {target!r} refused: an absolute target names a path "
            "outside the checkpoint namespace (use a relative one)"
        )
    check_link_text(target)
    if link_destination(path, target) is None:
        raise CkptLinkEscapes(
            f"symlink {path!r} -> {target!r} refused: the target leaves the checkpoint namespace"
        )
    return target


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
