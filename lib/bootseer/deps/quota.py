"""Capture quotas: how many stored bytes of snapshots one scope may hold in the store.

The epilog captures a job's install into the job's scope (``user/NAME``,
``account/NAME`` or ``cluster``); the site bounds each kind of scope with
``deps.quota`` (stored bytes; 0: none). A capture starts only if the scope holds less
than its quota and stops as soon as its own upload would take the scope past it: the
archive in flight is discarded, no manifest or ref is written, and the epilog records
a skip that says why. Two captures of one scope at once may each see room for
themselves: the quota can be passed by what captures in flight upload.

    >>> from bootseer.store import open_store
    >>> store = open_store("file:///tmp/doc-deps-quota")
    >>> store.write_bytes("deps/user/ada/" + "1" * 32 + "/data-0123456789abcdef.tar.zst", b"x" * 10)
    >>> q = scope_quota(store, "user/ada", {"user": 64})
    >>> q.used >= 10, q.limit
    (True, 64)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from bootseer.deps.capture import SnapshotQuotaExceeded
from bootseer.deps.layout import ROOT
from bootseer.options import SCOPES
from bootseer.store import Store

__all__ = ["KINDS", "ScopeQuota", "SnapshotQuotaExceeded", "scope_quota", "scope_usage"]

KINDS = SCOPES  # a quota per scope (deps.quota)


@dataclass(frozen=True)
class ScopeQuota:
    scope: str
    limit: int  # stored bytes the scope may hold; 0: no quota
    used: int  # stored bytes the scope holds now (archives, manifests, refs, marks)

    @property
    def room(self) -> int | None:
        """Stored bytes a capture may still upload; None: no quota."""
        return None if not self.limit else max(0, self.limit - self.used)

    def describe(self) -> str:
        return (
            f"scope {self.scope} holds {self.used} stored bytes of its deps.quota "
            f"{self.scope.split('/', 1)[0]}={self.limit}"
        )


def scope_usage(store: Store, scope: str) -> int:
    """Stored bytes under the scope's directory: every snapshot, whole or not."""
    return sum(o.size for o in store.list(f"{ROOT}/{scope}", recursive=True))


def scope_quota(store: Store, scope: str, quotas: Mapping[str, int]) -> ScopeQuota:
    """The quota of ``scope`` (``user/NAME``, ``account/NAME``, ``cluster``) and its use;
    the store is listed only when the scope's kind has a quota."""
    limit = int(quotas.get(scope.split("/", 1)[0], 0))
    return ScopeQuota(scope, limit, scope_usage(store, scope) if limit else 0)
