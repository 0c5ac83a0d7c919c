"""Checkpoint quotas (``[ckpt] quota``, :mod:`bootseer.ckpt.quota`): the writer is refused
with EDQUOT before an upload would take the user (or her Slurm account) past the quota,
keeps the previous version and leaves nothing behind; usage is what the store holds."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest

from bootseer.ckpt import Namespace
from bootseer.ckpt import quota as ckpt_quota
from bootseer.ckpt.errors import CkptQuotaExceeded
from bootseer.ckpt.quota import QuotaGuard, Scope, scopes_for, user_bytes
from bootseer.config import SiteConfig
from bootseer.errors import ConfigError
from bootseer.slurm.accounts import parse_associations
from bootseer.store import Store, open_store

from .conftest import UNIT


def _stores(targets: list[str]) -> list[Store]:
    return [open_store(u) for u in targets]


def _ns(targets: list[str], name: str, limit: int, rescan: float = 3600.0) -> Namespace:
    ns = Namespace(_stores(targets), name, unit_size=UNIT, max_inflight=2)
    user = name.split("/", 1)[0]
    ns.quota = QuotaGuard(ns.targets, [Scope("user", user, limit, (user,))], rescan)
    return ns


def _objects(targets: list[str]) -> set[str]:
    return {o.key for t in _stores(targets) for o in t.list("", recursive=True)}


def test_quota_is_a_site_setting_per_kind(tmp_path: Path) -> None:
    cfg = SiteConfig.from_mapping({})
    assert cfg.ckpt.quota == {"user": 1 << 40, "account": 0}
    cfg = SiteConfig.from_mapping({"ckpt": {"quota": {"user": 5}}})
    assert cfg.ckpt.quota == {"user": 5, "account": 0}
    cfg = SiteConfig.from_mapping({"ckpt": {"quota": {"user": 0, "account": 7}}})
    assert cfg.ckpt.quota == {"user": 0, "account": 7}  # user 0: none
    with pytest.raises(ConfigError, match=r"ckpt\.quota\.group"):
        SiteConfig.from_mapping({"ckpt": {"quota": {"group": 5}}})
    with pytest.raises(ConfigError, match="must not be negative"):
        SiteConfig.from_mapping({"ckpt": {"quota": {"user": -1}}})


def test_a_write_past_the_quota_fails_with_edquot_and_keeps_the_previous_version(
    targets: list[str],
) -> None:
    ns = _ns(targets, "ada/run", limit=10 * UNIT)
    old = os.urandom(4 * UNIT)
    with ns.open("model.pt", "wb") as f:
        f.write(old)
    before = _objects(targets)
    used = user_bytes(ns.targets, "ada")
    assert 4 * UNIT < used < 5 * UNIT  # the units and the manifest
    # Eleven units: past the quota even with the room of the four it replaces.
    with pytest.raises(CkptQuotaExceeded) as info, ns.open("model.pt", "wb") as f:
        for _ in range(11):
            f.write(os.urandom(UNIT))
    assert info.value.errno == errno.EDQUOT
    assert "would pass the ckpt.quota of user ada, user=40.0 KiB" in str(info.value)
    assert "bootseer ckpt rm" in str(info.value)
    assert _objects(targets) == before  # no unit of the dropped version is left
    with ns.open("model.pt") as r:
        assert r.read() == old
    # A smaller new version fits beside the old one, and replaces it.
    with ns.open("model.pt", "wb") as f:
        f.write(old[: 3 * UNIT])
    assert user_bytes(ns.targets, "ada") < used


def test_a_file_written_anew_may_use_the_room_of_the_version_it_replaces(
    targets: list[str],
) -> None:
    """``latest.pt`` saved again and again: the commit deletes the previous version, so
    the new one may use its room meanwhile (at most the quota plus that file)."""
    ns = _ns(targets, "ada/run", limit=10 * UNIT)
    with ns.open("latest.pt", "wb") as f:
        f.write(os.urandom(6 * UNIT))
    for size in (7, 8):
        with ns.open("latest.pt", "wb") as f:
            f.write(os.urandom(size * UNIT))
        assert size * UNIT < user_bytes(ns.targets, "ada") < (size + 1) * UNIT
    # Beyond the quota even with the room of the version it replaces: refused. That room is
    # all ada holds: the units and the manifest (whose size goes with the targets' paths).
    room = user_bytes(ns.targets, "ada")
    replaced = re.escape(f"less the {room / 1024:.1f} KiB of the version it replaces")
    with pytest.raises(CkptQuotaExceeded, match=replaced), ns.open("latest.pt", "wb") as f:
        f.write(os.urandom(11 * UNIT))
    m = ns.manifest("latest.pt")
    assert m is not None and m.size == 8 * UNIT
    # Another file gets no such room.
    with pytest.raises(CkptQuotaExceeded), ns.open("other.pt", "wb") as f:
        f.write(os.urandom(3 * UNIT))


def test_after_a_commit_mid_write_the_replaced_room_is_not_borrowed_again(
    targets: list[str],
) -> None:
    """An fsync publishes the new version and deletes the old one: what the writer may
    borrow ends there."""
    ns = _ns(targets, "ada/run", limit=10 * UNIT)
    with ns.open("latest.pt", "wb") as f:
        f.write(os.urandom(6 * UNIT))
    with pytest.raises(CkptQuotaExceeded), ns.open("latest.pt", "wb") as f:
        f.write(os.urandom(7 * UNIT))  # borrows the 6 units of the old version
        f.commit()  # which is deleted now
        f.write(os.urandom(6 * UNIT))  # 13 units: past the quota, no room to borrow
    assert user_bytes(ns.targets, "ada") < 10 * UNIT


def test_removing_frees_room_at_once_and_other_users_are_not_charged(
    targets: list[str],
) -> None:
    ns = _ns(targets, "ada/run", limit=6 * UNIT)
    with ns.open("a.pt", "wb") as f:
        f.write(os.urandom(5 * UNIT))
    with pytest.raises(CkptQuotaExceeded), ns.open("b.pt", "wb") as f:
        f.write(os.urandom(2 * UNIT))
    bea = _ns(targets, "bea/run", limit=6 * UNIT)
    with bea.open("b.pt", "wb") as f:
        f.write(os.urandom(5 * UNIT))  # ada's full quota is not bea's
    ns.remove("a.pt")
    # The guard's count still holds a.pt; the refusal counts again and finds room.
    with ns.open("b.pt", "wb") as f:
        f.write(os.urandom(2 * UNIT))


def test_another_nodes_uploads_count_at_the_next_count(targets: list[str]) -> None:
    """Two guards of one user (two nodes): each learns of the other's uploads when it
    counts again, which it does when its count is older than quota_rescan."""
    now = [0.0]
    scope = [Scope("user", "ada", 8 * UNIT, ("ada",))]
    n1 = Namespace(_stores(targets), "ada/a", unit_size=UNIT)
    n2 = Namespace(_stores(targets), "ada/b", unit_size=UNIT)
    n1.quota = QuotaGuard(n1.targets, scope, rescan=10.0, clock=lambda: now[0])
    n2.quota = QuotaGuard(n2.targets, scope, rescan=10.0, clock=lambda: now[0])
    n1.quota.charge(0, "count now")
    n2.quota.charge(0, "count now")
    with n1.open("x", "wb") as f:
        f.write(os.urandom(4 * UNIT))
    # n2's count is fresh: it does not see n1's four units yet (the bounded race).
    assert n2.quota.usage()[0].used == 0
    now[0] = 11.0
    assert n2.quota.usage()[0].used > 4 * UNIT
    with pytest.raises(CkptQuotaExceeded), n2.open("y", "wb") as f:
        f.write(os.urandom(5 * UNIT))
    assert n2.quota.scans >= 2


def test_no_quota_counts_nothing(targets: list[str]) -> None:
    ns = _ns(targets, "ada/run", limit=0)
    with ns.open("a.pt", "wb") as f:
        f.write(os.urandom(3 * UNIT))
    assert ns.quota is not None and ns.quota.scans == 0


def test_an_account_quota_counts_all_its_users(
    targets: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where Slurm checks accounts, ``account`` bounds the stored bytes of all of an
    account's users together: ada's write fails when bea has filled their account."""
    sacctmgr = tmp_path / "sacctmgr"
    sacctmgr.write_text("#!/bin/sh\nprintf 'physics|\\nphysics|ada\\nphysics|bea\\nbio|cyd\\n'\n")
    sacctmgr.chmod(0o755)
    cfg = SiteConfig.from_mapping(
        {"ckpt": {"quota": {"user": 100 * UNIT, "account": 6 * UNIT}, "sacctmgr": str(sacctmgr)}}
    )
    monkeypatch.setattr("bootseer.slurm.accounts._members", None)
    monkeypatch.setattr("bootseer.slurm.accounts.account_check", lambda *_: "")
    stores = _stores(targets)
    guard = ckpt_quota.guard_for(cfg, stores, "ada")
    assert [(s.kind, s.name, s.users) for s in guard.scopes] == [
        ("user", "ada", ("ada",)),
        ("account", "physics", ("ada", "bea")),
    ]
    bea = Namespace(stores, "bea/run", unit_size=UNIT)
    with bea.open("big", "wb") as f:
        f.write(os.urandom(5 * UNIT))
    ada = Namespace(stores, "ada/run", unit_size=UNIT)
    ada.quota = guard
    with (
        pytest.raises(CkptQuotaExceeded, match=r"ckpt\.quota of account physics"),
        ada.open("x", "wb") as f,
    ):
        f.write(os.urandom(2 * UNIT))
    cyd = Namespace(stores, "cyd/run", unit_size=UNIT)
    cyd.quota = ckpt_quota.guard_for(cfg, stores, "cyd")
    with cyd.open("x", "wb") as f:  # another account
        f.write(os.urandom(5 * UNIT))
    rows = ckpt_quota.usage(cfg, stores, "ada")
    assert [(u.kind, u.name) for u in rows] == [("user", "ada"), ("account", "physics")]
    assert rows[1].used > 5 * UNIT and rows[0].used < UNIT
    # A Slurm that does not check accounts: a user is in whatever account she names,
    # so only her own quota holds.
    monkeypatch.setattr("bootseer.slurm.accounts.account_check", lambda *_: "no accounting")
    assert [s.kind for s in ckpt_quota.guard_for(cfg, stores, "ada").scopes] == ["user"]


def test_scopes_for_a_user_in_no_account() -> None:
    assert scopes_for("ada", {"user": 5, "account": 9}, {"bio": {"cyd"}}) == [
        Scope("user", "ada", 5, ("ada",))
    ]
    assert parse_associations("a|\na|x\nb|y\n\nbad\n") == {"a": {"x"}, "b": {"y"}}


def test_the_doors_usage_request_names_no_namespace() -> None:
    from bootseer.agentapi.ckpt import CkptUsage, CkptUsageReply, UsageRow
    from bootseer.agentapi.requests import parse_request

    assert parse_request({"op": "ckpt_usage"}) == CkptUsage()
    assert parse_request({"op": "ckpt_usage", "ns": "ignored"}) == CkptUsage()
    reply = CkptUsageReply([UsageRow("user", "ada", 5, 3)])
    assert CkptUsageReply.from_wire(reply.to_wire()) == reply


def test_room_borrowed_from_a_version_another_writer_replaced_is_not_kept(
    targets: list[str],
) -> None:
    """Two writers of one name: the second commits a small version first, deleting the
    one the first borrowed room from. The first's commit replaces the small version
    only, so that is all the room it may keep: refused, not 11 units stored under a
    quota of 10 (and more each round after, without bound). Margins of 2 units or more
    everywhere: a count taken while uploads are in flight counts them twice."""
    ns = _ns(targets, "ada/run", limit=10 * UNIT)
    with ns.open("latest.pt", "wb") as f:
        f.write(os.urandom(4 * UNIT))
    before = user_bytes(ns.targets, "ada")
    replaced = "of the version it replaces"
    with pytest.raises(CkptQuotaExceeded, match=replaced), ns.open("latest.pt", "wb") as big:
        big.write(os.urandom(7 * UNIT))  # borrows the room of the 4 units
        with ns.open("latest.pt", "wb") as small:
            small.write(b"x")  # committed: the 4 units are deleted
        big.write(os.urandom(4 * UNIT))  # 11 units, within 10 + the 4 borrowed
    m = ns.manifest("latest.pt")
    assert m is not None and m.size == 1  # the small version stays
    assert user_bytes(ns.targets, "ada") < before  # nothing of the big one is left


def test_a_refusal_counts_the_store_again_only_once_its_uploads_have_landed(
    targets: list[str],
) -> None:
    """An upload stored while the store is listed, but landed (``landed``) after, was
    counted twice: in the listing and as this writer's own. On a loaded node the mount
    refused a.pt saved again at 8 of 10 units (tests/ckpt/test_quota_mount.py). A refusal
    now waits for the uploads in flight to land before it counts."""
    import threading

    stores = _stores(targets)
    stores[0].write_bytes("ada/ns/units/old/0", b"x" * 3 * UNIT)
    guard = QuotaGuard(stores, [Scope("user", "ada", 10 * UNIT, ("ada",))], rescan=3600.0)
    guard.charge(0, "count now")  # counts the 3 units of an old version
    stores[0].delete("ada/ns/units/old/0")  # gone: the next count shows it
    guard.charge(6 * UNIT, "ada/ns:a")  # six units in flight...
    stores[1].write_bytes("ada/ns/units/v/0", b"x" * 6 * UNIT)  # ...stored...
    late = threading.Timer(0.3, guard.landed, (6 * UNIT,))  # ...and landed a moment later
    late.start()
    try:
        # 3 counted + 6 in flight + 4 > 10: counted again. Listed at once, the 6 stored
        # units were counted and still in flight too: 16, refused. Counted once they
        # landed: 6 + 4 = 10, room.
        guard.charge(4 * UNIT, "ada/ns:b")
    finally:
        late.join()
    assert guard.usage()[0].used == 10 * UNIT
