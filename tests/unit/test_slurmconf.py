"""scope=account needs a Slurm that checks a job's account against its user."""

from __future__ import annotations

from pathlib import Path

import pytest

from bootseer.config import SiteConfig
from bootseer.deps import step
from bootseer.slurmconf import account_check, account_unchecked_reason, parse_show_config

# As Slurm 22.05's `scontrol show config` prints it.
SHOW_CONFIG = """Configuration data as of 2026-11-24T00:10:00
AccountingStorageBackupHost = (null)
AccountingStorageEnforce = {enforce}
AccountingStorageHost   = localhost
AccountingStorageType   = {storage}
AccountingStoreFlags    = (null)

Cgroup Support Configuration:
AllowedKmemSpace        = (null)
"""


def _config(enforce: str, storage: str = "accounting_storage/slurmdbd") -> dict[str, str]:
    return parse_show_config(SHOW_CONFIG.format(enforce=enforce, storage=storage))


@pytest.mark.parametrize("enforce", ["associations", "limits,qos", "safe", "wckeys", "QOS"])
def test_enforced_associations_check_the_account(enforce: str) -> None:
    assert account_unchecked_reason(_config(enforce)) == ""


@pytest.mark.parametrize(
    ("enforce", "storage", "why"),
    [
        ("none", "accounting_storage/slurmdbd", "without associations"),
        ("nojobs,nosteps", "accounting_storage/slurmdbd", "without associations"),
        ("associations", "accounting_storage/none", "keeps no accounting"),
    ],
)
def test_without_enforced_associations_the_account_is_the_users_word(
    enforce: str, storage: str, why: str
) -> None:
    assert why in account_unchecked_reason(_config(enforce, storage))


def test_a_slurm_that_does_not_answer_checks_nothing(tmp_path: Path) -> None:
    account_check.cache_clear()
    assert "cannot ask Slurm" in account_check(str(tmp_path / "no-scontrol"), 1.0)


def test_account_scope_falls_back_to_user_unless_slurm_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = SiteConfig.from_mapping(
        {"deps": {"scopes": ["user", "account"], "scontrol": str(tmp_path / "no-scontrol")}}
    )
    account_check.cache_clear()
    scope, note = step.effective_scope("account", cfg)
    assert scope == "user" and "scope=account refused" in note and "using scope=user" in note
    monkeypatch.setattr("bootseer.slurmconf.account_check", lambda *_: "")
    assert step.effective_scope("account", cfg) == ("account", "")
    assert step.effective_scope("user", cfg) == ("user", "")
    strict = SiteConfig.from_mapping({"deps": {"scopes": ["user"]}})
    assert step.effective_scope("account", strict)[0] == "user"
