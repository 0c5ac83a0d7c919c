"""Which located pieces are a job's, for its peers (issue 21 item 8).

A peer proves it is a root agent of job J (the job's token) and asks for a located
piece: a byte range of a ``deps/`` object in the main store, or a checkpoint unit on
a target. Before, any such piece whose digest the asker knew was served. Now only one
that J's own manifests can name: a snapshot in one of J's scopes (``deps/user/<J's
user>/``, ``deps/account/<J's account>/``, ``deps/cluster/``) or a unit under J's
user's checkpoint namespaces (``<J's user>/...`` on a target). Whose J is and its
account come from Slurm (``squeue --jobs=J --format='%U %a'``), asked once per job and
kept; a job Slurm cannot place gets nothing (the asker reads the store).

    >>> in_scope("", "deps/user/ada/k1/data-0.tar.zst", "ada", "physics")
    True
    >>> in_scope("", "deps/user/bob/k1/data-0.tar.zst", "ada", "physics")
    False
    >>> in_scope("s3://ckpt-a/", "bob/llama/units/v1/0", "ada", "physics")
    False
"""

from __future__ import annotations

import pwd
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bootseer.p2p.wire import PeerError
from bootseer.slurmjobs import JobOwner, SlurmUnavailable, job_owner

KEEP = 10_000  # jobs whose owner is kept; past it the table starts afresh
RETRY = 5.0  # seconds before Slurm is asked again about a job it could not place


@dataclass(frozen=True)
class Scope:
    user: str
    account: str


def in_scope(target: str, key: str, user: str, account: str) -> bool:
    """Whether a job of ``user`` under ``account`` may have the piece at ``key``."""
    parts = key.split("/")
    if target:
        return parts[0] == user
    if parts[:1] != ["deps"] or len(parts) < 3:
        return False
    if parts[1] == "cluster":
        return True
    return (parts[1], parts[2]) in {("user", user), ("account", account)}


class JobScopes:
    """Each job's user and account, from Slurm, and the check of a located piece."""

    def __init__(
        self,
        squeue: Path,
        timeout: float,
        log: Callable[[str], None],
        owner: Callable[[int], JobOwner | None] | None = None,
    ) -> None:
        self.log = log
        self._owner = owner or (lambda job: job_owner(job, squeue, timeout))
        self._known: dict[int, Scope] = {}
        self._unknown: dict[int, float] = {}
        self._lock = threading.Lock()

    def scope(self, job_id: int) -> Scope | None:
        with self._lock:
            known = self._known.get(job_id)
            if known is not None:
                return known
            if time.monotonic() - self._unknown.get(job_id, float("-inf")) < RETRY:
                return None
        try:
            owner = self._owner(job_id)
            scope = None if owner is None else Scope(pwd.getpwuid(owner.uid).pw_name, owner.account)
        except (SlurmUnavailable, KeyError) as exc:
            self.log(f"job={job_id} p2p: whose job it is is unknown ({exc}): no located pieces")
            scope = None
        with self._lock:
            if scope is None:
                if len(self._unknown) >= KEEP:
                    self._unknown.clear()
                self._unknown[job_id] = time.monotonic()
            else:
                if len(self._known) >= KEEP:
                    self._known.clear()
                self._known[job_id] = scope
        return scope

    def learn(self, job_id: int, uid: int, account: str) -> None:
        """Whose ``job_id`` is, as this node's own prolog or mount daemon says (root's
        word, from Slurm's environment): a job known so costs slurmctld no squeue, which
        on N nodes would be N queries per job start. Every piece the job asks for says
        it again: the user's name is looked up once per job, not per piece."""
        with self._lock:
            if job_id in self._known:
                return
        try:
            scope = Scope(pwd.getpwuid(uid).pw_name, account)
        except KeyError:
            return  # no such user here: Slurm is asked when a peer needs it
        with self._lock:
            if len(self._known) >= KEEP:
                self._known.clear()
            self._known[job_id] = scope
            self._unknown.pop(job_id, None)

    def check(self, job_id: int, target: str, key: str) -> None:
        """PeerError("missing") unless the piece at ``key`` can be one of job's."""
        scope = self.scope(job_id)
        if scope is None or not in_scope(target, key, scope.user, scope.account):
            raise PeerError("missing", f"not a piece of job {job_id}: {key[:100]!r}")
