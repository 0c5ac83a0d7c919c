"""Checkpoint manifests are sealed by the mount daemon (root); it refuses one that a user
without the site key planted or altered on the targets, and what a user's own
``bootseer ckpt put`` or Python API commits (unsealed) is not served (docs/security.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bootseer.ckpt import Namespace
from bootseer.ckpt.manifest import Manifest, new_version, unit_checksum
from bootseer.sitekey import CKPT_MANIFEST, SiteKeys
from bootseer.store import open_store
from tests.sitekeys import KEY, KEYS

from .conftest import JOB_UID, UNIT, needs_fuse
from .test_mount import as_user

pytestmark = needs_fuse


def _user_ns(targets: list[str]) -> Namespace:
    """What a user's own process has: the targets, no key."""
    return Namespace([open_store(u) for u in targets], "nobody/test", unit_size=UNIT)


def test_the_daemon_seals_what_the_job_saves(
    mounted: tuple[Path, object], job_ns: Namespace
) -> None:
    mp, _ = mounted
    as_user(JOB_UID, "sh", "-c", f"echo weights > {mp}/m.pt")
    raw = job_ns.meta.read_bytes(job_ns.manifest_key("m.pt"))
    KEYS.open(CKPT_MANIFEST, job_ns.manifest_key("m.pt"), raw)
    with job_ns.open("m.pt") as f:
        assert f.read() == b"weights\n"


def test_a_planted_manifest_is_refused_by_the_mount(
    mounted: tuple[Path, object], job_ns: Namespace, targets: list[str]
) -> None:
    """mallory writes units and a manifest into the victim's namespace on the targets
    (she can reach the store); the victim's job cannot read it (EIO), and the daemon's
    log says why."""
    mp, rec = mounted
    with job_ns.open("model.pt", "wb") as f:
        f.write(b"genuine")
    evil = b"import os; os.system('pwned')"
    ns = _user_ns(targets)
    version = new_version()
    ns.targets[0].write_bytes(ns.unit_key(version, "0"), evil)
    m = Manifest(version, len(evil), UNIT, (ns.targets[0].uri,), (("0", unit_checksum(evil)),))
    ns.meta.write_bytes(ns.manifest_key("model.pt"), m.to_json())
    r = as_user(JOB_UID, "cat", f"{mp}/model.pt", check=False)
    assert r.returncode != 0 and evil not in r.stdout
    assert b"Input/output error" in r.stderr, r.stderr
    log = Path(rec.log).read_text()  # type: ignore[attr-defined]
    assert "not sealed with the site key" in log, log


def test_a_users_own_put_is_not_served_but_an_admins_is(
    mounted: tuple[Path, object], targets: list[str]
) -> None:
    mp, _ = mounted
    with _user_ns(targets).open("mine.pt", "wb") as f:
        f.write(b"by the user")
    r = as_user(JOB_UID, "cat", f"{mp}/mine.pt", check=False)
    assert r.returncode != 0 and b"by the user" not in r.stdout
    # The job may still replace it through the mount, which seals the new version.
    as_user(JOB_UID, "sh", "-c", f"echo again > {mp}/new.pt && mv {mp}/new.pt {mp}/mine2.pt")
    assert as_user(JOB_UID, "cat", f"{mp}/mine2.pt").stdout == b"again\n"
    # An admin with the (rotated) key: new key first, the old still read.
    rotated = SiteKeys([b"the-new-site-key-0123456789abcdef", KEY])
    admin = Namespace([open_store(u) for u in targets], "nobody/test", unit_size=UNIT, keys=rotated)
    with admin.open("mine2.pt") as f:
        assert f.read() == b"again\n"
    with admin.open("admin.pt", "wb") as f:
        f.write(os.urandom(10))
    # Sealed with the new key, which this daemon's file does not hold yet: refused there.
    r = as_user(JOB_UID, "cat", f"{mp}/admin.pt", check=False)
    assert r.returncode != 0
    with pytest.raises(Exception, match="does not verify"):
        Namespace(admin.targets, "nobody/test", unit_size=UNIT, keys=KEYS).manifest("admin.pt")
