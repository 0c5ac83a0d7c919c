"""``bootseer image show``: one image, its blocks and the traces its jobs prefetch.

Root reads the store itself and sees every user's trace, unchecked (an admin's view).
A user holds no store credentials and may not read ``images/`` (on S3 the anonymous
identity reaches ``phases/`` only; on a ``file://`` store the records are root's), so her
``image show`` asks the node agent (``image_show``, :class:`~bootseer.agentapi.views.ImageShow`),
which answers with what is hers to see: a name (published to every job user) whose
sealed record and manifest verify, and of its traces only the two her jobs use, her own
and the name's trace owner's. A path image's record names another user's file and an
image id may be anyone's path image: those stay root's view.

    >>> image_doc(Manifest(10, 4, ("cd" * 32,) * 3), None, {})["distinct_blocks"]
    1
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from bootseer.agentapi.errors import AgentBadRequest, AgentNotFound, AgentRefused
from bootseer.errors import ManifestError
from bootseer.image.manifest import Manifest
from bootseer.image.trace import Trace
from bootseer.sitekey import SealError, SiteKeys
from bootseer.store import Store

IMAGE_ID = re.compile(r"[0-9a-f]{64}")
ADMIN_VIEW = "root's `bootseer image show`"


def trace_summary(m: Manifest, t: Trace) -> dict[str, object]:
    hot = sum(m.block_length(i) for i in t.blocks)
    bundled = (
        sum(
            m.block_length(i)
            for chunk, bid in zip(t.chunks(t.bundle_blocks), t.bundles, strict=False)
            if bid is not None
            for i in chunk
        )
        if t.bundle_blocks
        else 0
    )
    return {
        "blocks": len(t.blocks),
        "runs": t.runs,
        "hot_bytes": hot,
        "hot_fraction": round(hot / m.size, 4) if m.size else 0.0,
        "bundled_bytes": bundled,  # of the hot bytes, those also stored in bundles
    }


def image_doc(m: Manifest, owner: str | None, traces: dict[str, Trace]) -> dict[str, object]:
    """What ``image show`` prints (as JSON), for root and users alike."""
    doc: dict[str, object] = {
        "image": m.id,
        "size": m.size,
        "block_size": m.block_size,
        "blocks": m.nblocks,
        "distinct_blocks": len(set(m.blocks)),
        "traces": {user: trace_summary(m, t) for user, t in traces.items()},
    }
    if owner is not None:
        doc["trace_owner"] = owner
    return doc


def load_traces(
    store: Store,
    m: Manifest,
    users: Iterable[str],
    *,
    keys: SiteKeys | None,
    log: Callable[[str], None] = lambda _: None,
) -> dict[str, Trace]:
    from bootseer.image.trace import load_trace

    out = {}
    for user in dict.fromkeys(users):
        t = load_trace(store, m, log, keys=keys, user=user)
        if t is not None:
            out[user] = t
    return out


def show_for_user(store: Store, keys: SiteKeys, ref: str, user: str) -> dict[str, object]:
    """The agent's answer to ``user``'s ``image show REF``: a name only, verified, with
    her own trace and the name's trace owner's (the two her jobs prefetch)."""
    from bootseer.errors import OptionError
    from bootseer.image.registry import UnknownImage, lookup_name_record, name_key

    if ref.startswith("/") or IMAGE_ID.fullmatch(ref):
        what = "a path image" if ref.startswith("/") else "an image id"
        raise AgentRefused(
            f"{ref}: {what} is an admin view ({ADMIN_VIEW}); as a user, show a name "
            "(`srun bootseer image ls` lists them)"
        )
    try:
        name_key(ref)
    except OptionError as exc:
        raise AgentBadRequest(str(exc)) from None
    try:
        m, owner = lookup_name_record(store, ref, keys=keys)
    except UnknownImage:
        raise AgentNotFound(
            f"no image named {ref!r} (`srun bootseer image ls` lists them)"
        ) from None
    except (ManifestError, SealError):
        # What no job would be served is not shown either (as in image_ls).
        raise AgentNotFound(
            f"no image named {ref!r} (`srun bootseer image ls` lists them)"
        ) from None
    users = [u for u in (owner, user) if u is not None]
    return image_doc(m, owner, load_traces(store, m, users, keys=keys))
