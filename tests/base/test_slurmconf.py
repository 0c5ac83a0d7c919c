"""Slurm's configuration as bootseer reads it: slurm.conf, plugstack.conf, ``scontrol show
config``; and scope=account needs a Slurm that checks a job's account against its user."""

from __future__ import annotations

from pathlib import Path

import pytest

from bootseer.config import SiteConfig
from bootseer.deps import step
from bootseer.slurm.accounts import account_check, account_unchecked_reason
from bootseer.slurm.conf import (
    SlurmConfError,
    has_alloc,
    parse_show_config,
    parse_slurm_conf,
    read_slurm_conf,
)
from bootseer.slurm.plugstack import parse_plugstack, plugstack_path

# -- slurm.conf and plugstack.conf -----------------------------------------------------


def test_slurm_conf_keys_are_case_insensitive_and_includes_are_read(tmp_path: Path) -> None:
    (tmp_path / "extra.conf").write_text("prologflags=Contain,X11\n")
    text = "PrologFlags=Alloc\nNodeName=n1 Port=1\nInclude extra.conf\nEpilog=/e # why\n"
    conf = parse_slurm_conf(text, tmp_path)
    assert conf["prologflags"] == "Contain,X11"
    assert conf["epilog"] == "/e"
    assert "nodename" not in conf


def test_prolog_flags() -> None:
    assert has_alloc("Alloc")
    assert has_alloc("X11, alloc")
    assert has_alloc("Contain")  # implies Alloc
    assert not has_alloc("X11,NoHold")
    assert not has_alloc("")


def test_plugstack_include_and_default_rundir(tmp_path: Path) -> None:
    d = tmp_path / "plugstack.conf.d"
    d.mkdir()
    (d / "bootseer.conf").write_text("optional /x/bootseer.so  # no rundir\n")
    main = tmp_path / "plugstack.conf"
    main.write_text("required /x/pyxis.so\ninclude plugstack.conf.d/*\n")
    entries = parse_plugstack(main)
    assert [(e.kind, e.plugin, e.rundir) for e in entries] == [
        ("required", "/x/pyxis.so", "/run/bootseer"),
        ("optional", "/x/bootseer.so", "/run/bootseer"),
    ]
    assert entries[1].source == d / "bootseer.conf"


def test_plugstack_path_defaults_next_to_slurm_conf() -> None:
    conf = Path("/etc/slurm/slurm.conf")
    assert plugstack_path({}, conf) == Path("/etc/slurm/plugstack.conf")
    assert plugstack_path({"plugstackconfig": "/p.conf"}, conf) == Path("/p.conf")


def test_an_unreadable_include_names_the_file(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("Include extra.conf\n")
    (tmp_path / "extra.conf").mkdir()  # read as a file: EISDIR
    with pytest.raises(SlurmConfError, match=r"cannot read .*/extra\.conf"):
        read_slurm_conf(conf)


# -- scontrol show config and accounts -------------------------------------------------


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
    monkeypatch.setattr("bootseer.slurm.accounts.account_check", lambda *_: "")
    assert step.effective_scope("account", cfg) == ("account", "")
    assert step.effective_scope("user", cfg) == ("user", "")
    strict = SiteConfig.from_mapping({"deps": {"scopes": ["user"]}})
    assert step.effective_scope("account", strict)[0] == "user"
