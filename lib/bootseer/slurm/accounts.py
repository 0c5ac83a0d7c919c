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
from collections.abc import Mapping

from bootseer.errors import describe
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
