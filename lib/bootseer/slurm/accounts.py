"""Whether the site's Slurm checks a job's account, from ``scontrol show config`` (the
admin's configuration, never a user's text).

``scope=account`` shares dependency snapshots among the jobs of one Slurm account, so
the account must be one Slurm checked the job's user may charge: only with accounting
and ``AccountingStorageEnforce`` including associations (or an option that implies them)
does slurmctld refuse a job whose user has no association with its ``--account``;
otherwise the account is whatever the user wrote.

    >>> account_unchecked_reason({"AccountingStorageType": "accounting_storage/slurmdbd",
    ...                           "AccountingStorageEnforce": "associations,limits"})
    ''
    >>> account_unchecked_reason({"AccountingStorageType": "accounting_storage/none",
    ...                           "AccountingStorageEnforce": "none"})
    'Slurm keeps no accounting (AccountingStorageType=accounting_storage/none)'
"""

from __future__ import annotations

import functools
import subprocess
import threading
import time
from collections.abc import Mapping

from bootseer.errors import BootseerError, describe
from bootseer.slurm.conf import parse_show_config

# AccountingStorageEnforce options that make slurmctld check the job's association
# (slurm.conf(5): limits, qos, safe and wckeys imply associations).
_ASSOCIATIONS = frozenset({"associations", "limits", "qos", "safe", "wckeys"})
MAX_CONFIG_BYTES = 4 << 20


def account_unchecked_reason(config: Mapping[str, str]) -> str:
    """Why Slurm does not check a job's account against its user; "" if it does."""
    storage = config.get("AccountingStorageType", "")
    if not storage or storage.endswith("/none"):
        return f"Slurm keeps no accounting (AccountingStorageType={storage or 'unset'})"
    enforce = {p.strip().lower() for p in config.get("AccountingStorageEnforce", "").split(",")}
    if not enforce & _ASSOCIATIONS:
        return (
            "Slurm does not check a job's account against its user (AccountingStorageEnforce="
            f"{config.get('AccountingStorageEnforce', 'unset')}, without associations)"
        )
    return ""


@functools.lru_cache(maxsize=4)
def account_check(scontrol: str, timeout: float) -> str:
    """:func:`account_unchecked_reason` of the running Slurm's configuration, asked once
    per process; a Slurm that does not answer counts as not checking."""
    try:
        r = subprocess.run(
            [scontrol, "show", "config"], capture_output=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot ask Slurm whether it checks accounts ({scontrol}: {describe(exc)})"
    if r.returncode != 0 or len(r.stdout) > MAX_CONFIG_BYTES:
        return f"cannot ask Slurm whether it checks accounts ({scontrol} show config failed)"
    return account_unchecked_reason(parse_show_config(r.stdout.decode(errors="replace")))


MAX_SACCTMGR_BYTES = 16 << 20
MEMBERS_TTL = 60.0  # seconds a process keeps Slurm's list of associations


class SlurmAccountsError(BootseerError):
    """Slurm did not say which users each account has (``sacctmgr`` failed or hung)."""


def parse_associations(text: str) -> dict[str, set[str]]:
    """``sacctmgr -nP show associations format=account,user``: account -> its users."""
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        account, sep, user = line.strip().partition("|")
        if sep and account:
            users = out.setdefault(account, set())
            if user:
                users.add(user)
    return out


_members: tuple[float, str, dict[str, set[str]]] | None = None
_members_lock = threading.Lock()


def associations(sacctmgr: str, timeout: float = 5.0) -> dict[str, set[str]]:
    """Slurm's accounts and their users, asked at most once a minute per process; a
    Slurm that does not answer raises :class:`CkptError` (a write is then refused: the
    account's quota cannot be checked)."""
    global _members
    with _members_lock:
        now = time.monotonic()
        if _members is not None and _members[1] == sacctmgr and now - _members[0] < MEMBERS_TTL:
            return _members[2]
        argv = [sacctmgr, "-nP", "show", "associations", "format=account,user"]
        try:
            r = subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmAccountsError(
                f"cannot list Slurm's associations ({sacctmgr}: {describe(exc)})"
            ) from None
        if r.returncode != 0 or len(r.stdout) > MAX_SACCTMGR_BYTES:
            raise SlurmAccountsError(
                f"cannot list Slurm's associations ({sacctmgr} failed: "
                f"{r.stderr.decode(errors='replace').strip()[:200]})"
            )
        found = parse_associations(r.stdout.decode(errors="replace"))
        _members = (now, sacctmgr, found)
        return found
