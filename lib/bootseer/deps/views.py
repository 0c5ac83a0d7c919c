"""``bootseer deps ls|show`` for a user: her snapshots, through the node agent.

A user holds no store credentials and may not read ``deps/`` (on S3 the anonymous
identity reaches ``phases/`` only; on a ``file://`` store snapshots are root's), so her
``deps ls`` and ``deps show`` ask the node agent (``deps_ls``, ``deps_show``:
:class:`~bootseer.agentapi.views.DepsList`, :class:`~bootseer.agentapi.views.DepsShow`),
which answers for the scopes her jobs restore from and no other (:func:`scopes_of`): her
own (``user/<her>``), ``cluster`` where the site allows it, and ``account/<A>`` where the
site allows account scopes, Slurm checks a job's account, and she is in ``A``. A
snapshot's manifest is shown only when it verifies (what her jobs would restore); root's
``deps ls|show`` reads the store itself, every scope, unchecked.

    >>> check_scopes(["user/alice"], ["user/alice", "cluster"], "alice")
    ['user/alice']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING

from bootseer.agentapi.errors import AgentBadRequest, AgentNotFound, AgentRefused
from bootseer.agentapi.views import DepsListReply, DepsShowReply, SnapshotRow

if TYPE_CHECKING:
    from bootseer.config import SiteConfig
    from bootseer.sitekey import SiteKeys
    from bootseer.store import Store

MAX_LISTED = 10_000  # snapshots one listing returns at most


def scopes_of(
    cfg: SiteConfig, user: str, accounts: Callable[[], dict[str, set[str]]] | None = None
) -> list[str]:
    """The scopes ``user``'s jobs may restore from (bootseer.deps.step.effective_scope):
    hers, ``cluster`` if the site allows it, and each account of hers if the site allows
    account scopes and Slurm checks accounts (``accounts``: Slurm's associations)."""
    out = [f"user/{user}"]
    if "cluster" in cfg.deps.scopes:
        out.append("cluster")
    if "account" in cfg.deps.scopes:
        from bootseer.slurm.accounts import account_check

        if not account_check(str(cfg.deps.scontrol), 5.0):
            if accounts is None:
                from bootseer.slurm.accounts import associations

                def accounts() -> dict[str, set[str]]:
                    return associations(str(cfg.ckpt.sacctmgr))

            try:
                members = accounts()
            except Exception:  # Slurm not answering: her own scopes still are
                members = {}
            out += [f"account/{a}" for a in sorted(members) if user in members[a]]
    return out


def check_scopes(asked: Sequence[str], mine: Sequence[str], user: str) -> list[str]:
    """``asked`` (none: her user scope) if every one is hers to see; else refused, saying
    which are."""
    scopes = list(asked) or [f"user/{user}"]
    for scope in scopes:
        if scope not in mine:
            raise AgentRefused(
                f"scope {scope} is not one your jobs restore from (yours: {', '.join(mine)})"
            )
    return scopes


def list_for(store: Store, cfg: SiteConfig, user: str, asked: Sequence[str]) -> DepsListReply:
    from bootseer.deps.gc import list_snapshots

    scopes = check_scopes(asked, scopes_of(cfg, user), user)
    snaps = list_snapshots(store, scopes)
    rows = [SnapshotRow(**asdict(s)) for s in snaps[:MAX_LISTED]]
    return DepsListReply(rows, scopes)


def show_for(
    store: Store, cfg: SiteConfig, keys: SiteKeys, user: str, scope: str, key: str
) -> DepsShowReply:
    from bootseer.deps.layout import is_key
    from bootseer.deps.restore import read_manifest
    from bootseer.errors import ManifestError
    from bootseer.sitekey import SealError

    (scope,) = check_scopes([scope] if scope else [], scopes_of(cfg, user), user)
    if not is_key(key):
        raise AgentBadRequest(f"{key!r} is not a snapshot key (`bootseer deps ls` lists them)")
    missing = AgentNotFound(f"no snapshot {key} in scope {scope}")
    try:
        found = read_manifest(
            store,
            scope,
            key,
            max_bytes=cfg.deps.max_bytes,
            max_files=cfg.deps.max_files,
            max_frame_bytes=cfg.deps.max_frame_bytes,
            keys=keys,
        )
    except (ManifestError, SealError):
        raise missing from None  # what no job of hers would restore is not shown either
    if found is None:
        raise missing
    m, size = found
    return DepsShowReply(m.to_json().decode(), size)
