"""Checkpoint quotas: how many stored bytes one user's checkpoints may hold on the targets.

The mount daemon and the checkpoint door write as root, so no filesystem quota of the
user's bounds what she saves: ``[ckpt] quota`` does. ``user``: the stored bytes under
``<user>/`` on all K targets together; ``account``: those of all the users of one Slurm
account together (only where Slurm checks a job's account against its user,
:mod:`bootseer.slurm.accounts`, and lists associations: ``sacctmgr``); 0: no quota.

Usage is counted from what the store holds, never from a record of ours: every object
under the user's directory on every target (units, manifests, and units that a writer
is still uploading or that a crashed one left behind until ``ckpt gc``), so it is right
after a restart and whichever node wrote. Counting stored bytes rather than reading
manifests is also what cannot be escaped: a namespace part named ``files`` makes a
unit key look like a manifest key, and the listing is one request per page per target
instead of one per file.

A :class:`QuotaGuard` is charged before each upload (a unit, a manifest): past the
quota the upload is refused with :class:`~bootseer.ckpt.errors.CkptQuotaExceeded`
(``EDQUOT``) and the writer drops its new version (the previous one stays). It counts
the store again when its count is older than ``quota_rescan`` seconds, and always
before it refuses (once its uploads in flight have landed, :data:`LAND_WAIT` at most:
one landing while the store is listed would be counted twice): its own uploads (in
flight or landed) are added to the count as they go, deletions only show at the next
count. What nodes writing at once can do:
docs/ckpt.md, "Quotas".

    >>> import tempfile
    >>> from bootseer.store import open_store
    >>> d = tempfile.mkdtemp()
    >>> t = [open_store(f"file://{d}/a"), open_store(f"file://{d}/b")]
    >>> t[0].write_bytes("ada/ns/units/v/0", b"x" * 10)
    >>> g = QuotaGuard(t, [Scope("user", "ada", 64, ("ada",))])
    >>> g.charge(54, "ada/ns:f")
    >>> t[1].write_bytes("ada/ns/units/v/1", b"x" * 54)
    >>> g.landed(54)
    >>> g.charge(1, "ada/ns:f")
    Traceback (most recent call last):
    ...
    bootseer.ckpt.errors.CkptQuotaExceeded: ada/ns:f: 1 B more would pass the ckpt.quota of ...
    >>> import shutil; shutil.rmtree(d)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, get_args

from bootseer.agentapi.ckpt import ScopeKind
from bootseer.ckpt.errors import CkptQuotaExceeded
from bootseer.units import iec

if TYPE_CHECKING:
    from bootseer.config import SiteConfig
    from bootseer.store import Store

__all__ = [
    "KINDS",
    "QuotaGuard",
    "Scope",
    "ScopeUsage",
    "guard_for",
    "members",
    "usage",
]

KINDS: tuple[ScopeKind, ...] = get_args(ScopeKind)


@dataclass(frozen=True)
class Scope:
    """What one quota bounds: the stored bytes of ``users`` together."""

    kind: ScopeKind
    name: str  # the user's or the account's name
    limit: int  # stored bytes; 0: no quota
    users: tuple[str, ...]


@dataclass(frozen=True)
class ScopeUsage:
    kind: ScopeKind
    name: str
    limit: int
    used: int

    def describe(self) -> str:
        return (
            f"{self.kind} {self.name} holds {iec(self.used)} of its ckpt.quota "
            f"{self.kind}={iec(self.limit) if self.limit else 'none'}"
        )


def user_bytes(targets: Sequence[Store], user: str) -> int:
    """Stored bytes under ``<user>/`` on every target."""
    return sum(o.size for t in targets for o in t.list(user, recursive=True))


def count(targets: Sequence[Store], scopes: Sequence[Scope]) -> list[ScopeUsage]:
    """Each scope's stored bytes now (each user's directories listed once)."""
    by_user: dict[str, int] = {}
    out = []
    for s in scopes:
        for u in s.users:
            if u not in by_user:
                by_user[u] = user_bytes(targets, u)
        out.append(ScopeUsage(s.kind, s.name, s.limit, sum(by_user[u] for u in s.users)))
    return out


# Seconds a refusal waits for this writer's uploads in flight to land before it counts
# the store again (an upload that lands during the listing is counted twice: on a loaded
# node, a file saved again under its name was refused with half its quota free).
LAND_WAIT = 30.0


class QuotaGuard:
    """The quotas one writer (the mount daemon, a door's put) must keep, and its count."""

    def __init__(
        self,
        targets: Sequence[Store],
        scopes: Sequence[Scope],
        rescan: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.targets = list(targets)
        self.scopes = [s for s in scopes if s.limit]
        self.rescan = rescan
        self.clock = clock
        self.scans = 0
        self._lock = threading.Condition()  # landed() notifies: a refusal waits for it
        self._counted: list[ScopeUsage] = []
        self._at = float("-inf")
        self._since = 0  # bytes this process uploaded since the count
        self._inflight = 0  # charged, not yet landed: in no count

    def usage(self, fresh: bool = False) -> list[ScopeUsage]:
        """Each scope's use as this guard knows it (counted again when stale or asked)."""
        with self._lock:
            if fresh or self.clock() - self._at > self.rescan:
                self._count()
            return self._known()

    def tightest(self) -> ScopeUsage | None:
        """The scope with the least room as of the last count (no store request), or
        None before the first count or without a quota."""
        with self._lock:
            known = self._known()
        return min(known, key=lambda u: u.limit - u.used, default=None)

    def charge(self, n: int, what: str, credit: int = 0) -> None:
        """Before uploading ``n`` bytes for ``what`` (``user/ns:path``): room for them in
        every scope, or :class:`CkptQuotaExceeded` and nothing charged. ``credit``: stored
        bytes the write frees when it is done (the version of the file it replaces),
        which it may use meanwhile."""
        if not self.scopes:
            return
        with self._lock:
            fresh = False
            if self.clock() - self._at > self.rescan:
                self._count()
                fresh = True
            over = self._over(n - credit)
            if over is not None and not fresh:
                # Our count may be stale (deletions, an old count): ask the store before
                # refusing, once the uploads in flight have landed.
                self._lock.wait_for(lambda: self._inflight <= 0, LAND_WAIT)
                self._count()
                over = self._over(n - credit)
            if over is not None:
                freed = f", less the {iec(credit)} of the version it replaces" if credit else ""
                raise CkptQuotaExceeded(
                    f"{what}: {iec(n)} more would pass the ckpt.quota of {over.kind} "
                    f"{over.name}, {over.kind}={iec(over.limit)}: it holds {iec(over.used)}, "
                    f"this file's new version so far included{freed} (EDQUOT). Free room "
                    "with `bootseer ckpt rm` (or rm in the mount); `bootseer ckpt usage` "
                    "shows what you hold"
                )
            self._inflight += n

    def landed(self, n: int, stored: bool = True) -> None:
        """The upload of ``n`` charged bytes ended: stored (the next count sees them), or
        failed (never stored)."""
        if not self.scopes:
            return
        with self._lock:
            self._inflight -= n
            if stored:
                self._since += n
            self._lock.notify_all()

    def _count(self) -> None:
        # An upload that lands while the store is listed is counted twice until the next
        # count: more, never less.
        self._counted = count(self.targets, self.scopes)
        self._at = self.clock()
        self._since = 0
        self.scans += 1

    def _known(self) -> list[ScopeUsage]:
        mine = self._since + self._inflight
        return [ScopeUsage(u.kind, u.name, u.limit, u.used + mine) for u in self._counted]

    def _over(self, n: int) -> ScopeUsage | None:
        for u in self._known():
            if u.used + n > u.limit:
                return u
        return None


def scopes_for(user: str, quota: Mapping[str, int], members: Mapping[str, set[str]]) -> list[Scope]:
    """The scopes a write of ``user`` must fit: her own, and every account she is in."""
    out = [Scope("user", user, int(quota.get("user", 0)), (user,))]
    limit = int(quota.get("account", 0))
    if limit:
        for account in sorted(a for a, users in members.items() if user in users):
            out.append(Scope("account", account, limit, tuple(sorted(members[account]))))
    return out


def members(cfg: SiteConfig, log: Callable[[str], None] | None = None) -> Mapping[str, set[str]]:
    """Slurm's accounts and their users when the account quota applies: a quota is set
    and Slurm checks a job's account against its user (else a user is in whatever
    account she names); otherwise none. Slurm not answering: none, and a log line
    (only the user's quota then holds)."""
    if not cfg.ckpt.quota.get("account"):
        return {}
    from bootseer.slurm.accounts import account_check

    why = account_check(str(cfg.deps.scontrol), 5.0)
    if why:
        return {}
    from bootseer.slurm.accounts import SlurmAccountsError, associations

    try:
        return associations(str(cfg.ckpt.sacctmgr))
    except SlurmAccountsError as exc:
        if log is not None:
            log(f"ckpt.quota account: {exc}; only the user's quota holds")
        return {}


def guard_for(
    cfg: SiteConfig,
    targets: Sequence[Store],
    user: str,
    log: Callable[[str], None] | None = None,
) -> QuotaGuard:
    """The guard for ``user``'s writes under the site's ``[ckpt] quota``."""
    scopes = scopes_for(user, cfg.ckpt.quota, members(cfg, log))
    return QuotaGuard(targets, scopes, cfg.ckpt.quota_rescan)


def usage(cfg: SiteConfig, targets: Sequence[Store], user: str) -> list[ScopeUsage]:
    """What ``bootseer ckpt usage`` shows: every scope of ``user``'s, quota or not."""
    return count(targets, scopes_for(user, cfg.ckpt.quota, members(cfg)))
