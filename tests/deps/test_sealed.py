"""Snapshot manifests and refs are sealed by the epilog; the prolog refuses any that a
user without the site key planted or altered in the store (docs/security.md)."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest

from bootseer.deps import step
from bootseer.deps.capture import snapshot_exists
from bootseer.deps.layout import SnapshotPaths, ref_path
from bootseer.sitekey import DEPS_MANIFEST, SealError, load_keys, strip
from bootseer.store import Store
from tests.sitekeys import KEY, key_file

from .conftest import USER_A, entries_of, member, needs_root, publish, site, step_call, tar_bytes
from .test_steps import installed

pytestmark = pytest.mark.root

SPEC = "{prefix},key=req.txt"


def _first_run(scratch: Path, store: Store) -> tuple[Path, str, str]:
    """A job that installs and whose epilog captures; the prefix, base and snapshot key."""
    cfg = site(scratch)
    (scratch / "req.txt").write_text("numpy\n")
    prefix = scratch / "env"
    first = step_call(
        scratch, cfg, job_id=1, uid=USER_A, user="ada", deps=SPEC.format(prefix=prefix)
    )
    assert step.prolog(first).outcome == "skipped"
    installed(first, prefix)
    assert step.epilog(first).outcome == "ok"
    (ref,) = [o.key for o in store.list("deps/user/ada/refs")]
    base = ref.rsplit("/", 1)[1].removesuffix(".json")
    (key,) = [k for k in store.list_dirs("deps/user/ada") if k != "refs"]
    shutil.rmtree(prefix)
    return prefix, base, key


def _next_job(scratch: Path, prefix: Path, job_id: int, node: str):  # type: ignore[no-untyped-def]
    return step_call(
        scratch,
        site(scratch),
        job_id=job_id,
        uid=USER_A,
        user="ada",
        deps=SPEC.format(prefix=prefix),
        node=node,
        nodes=(node,),
    )


def _plant(store: Store, prefix: Path, base: str, key: str) -> None:
    """mallory's snapshot in ada's scope, at ada's key, written with the store API alone."""
    evil = [member("bin", tarfile.DIRTYPE), member("bin/tool", data=b"#!/bin/sh\necho pwned\n")]
    publish(
        store,
        tar_bytes(evil),
        entries_of(evil),
        prefix=str(prefix),
        base=base,
        key=key,
        keys=None,
    )


def test_a_planted_manifest_and_ref_are_refused_and_the_epilog_captures_anew(
    scratch: Path, store: Store
) -> None:
    needs_root()
    prefix, base, key = _first_run(scratch, store)
    _plant(store, prefix, base, key)
    call = _next_job(scratch, prefix, 2, "n2")
    # The runner logs the refusal; the job installs the ordinary way.
    with pytest.raises(SealError, match="not sealed with the site key"):
        step.prolog(call)
    assert not prefix.exists()
    # The job installs; its epilog does not take the planted manifest for a snapshot.
    installed(call, prefix)
    r = step.epilog(call)
    assert r.outcome == "ok" and "captured" in r.detail, r.detail
    shutil.rmtree(prefix)
    r = step.prolog(_next_job(scratch, prefix, 3, "n3"))
    assert r.outcome == "ok" and "restored" in r.detail, r.detail
    assert b"pwned" not in (prefix / "bin" / "tool").read_bytes()


def test_an_altered_manifest_is_refused(scratch: Path, store: Store) -> None:
    needs_root()
    prefix, _, key = _first_run(scratch, store)
    path = SnapshotPaths("user/ada", key).manifest
    raw = store.read_bytes(path)
    store.write_bytes(path, raw.replace(b'"node":"n1"', b'"node":"n9"'))
    with pytest.raises(SealError, match="does not verify"):
        step.prolog(_next_job(scratch, prefix, 2, "n2"))
    assert not snapshot_exists(store, "user/ada", key, keys=load_keys(scratch / "site.key"))
    assert snapshot_exists(store, "user/ada", key, keys=None)


def test_a_sealed_ref_moved_to_another_base_is_refused(scratch: Path, store: Store) -> None:
    needs_root()
    prefix, base, _ = _first_run(scratch, store)
    raw = store.read_bytes(ref_path("user/ada", base))
    (scratch / "req.txt").write_text("other\n")  # another base for the same prefix
    call = _next_job(scratch, prefix, 2, "n2")
    assert step.prolog(call).outcome == "skipped"  # no snapshot for this base yet
    other = json.loads((call.job.sub("deps") / "prolog.json").read_text())["base"]
    assert other != base
    store.write_bytes(ref_path("user/ada", other), raw)
    with pytest.raises(SealError, match="does not verify"):
        step.prolog(_next_job(scratch, prefix, 3, "n3"))


def test_the_epilogs_records_restore_and_a_rotated_key_still_reads_them(
    scratch: Path, store: Store
) -> None:
    needs_root()
    prefix, _, key = _first_run(scratch, store)
    raw = store.read_bytes(SnapshotPaths("user/ada", key).manifest)
    assert b'"mac":"' in raw and strip(raw).endswith(b"}")
    assert load_keys(scratch / "site.key").open(
        DEPS_MANIFEST, SnapshotPaths("user/ada", key).manifest, raw
    )
    # The admin rotates: a new key first, the old one kept for what it sealed.
    key_file(scratch, b"the-new-site-key-0123456789abcdef", KEY)
    r = step.prolog(_next_job(scratch, prefix, 2, "n2"))
    assert r.outcome == "ok" and "restored" in r.detail, r.detail
