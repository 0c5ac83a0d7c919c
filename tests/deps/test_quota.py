"""The epilog's capture is bounded per scope by ``deps.quota`` (stored bytes): past it,
a skip that says why and nothing written to the store (issue 11: a user naming any
directory, or installing without end, filled the store without limit)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from bootseer.config import SiteConfig
from bootseer.deps import step
from bootseer.deps.quota import scope_quota
from bootseer.errors import ConfigError
from bootseer.store import Store

from .conftest import USER_A, USER_B, needs_root, site, step_call
from .test_steps import installed

pytestmark = pytest.mark.root


def _files(store_dir: Path) -> set[str]:
    """Every file under the store's directory, temporary ones included."""
    return {str(p.relative_to(store_dir)) for p in store_dir.rglob("*") if p.is_file()}


def _job(scratch: Path, cfg: SiteConfig, job_id: int, uid: int, user: str, req: str):  # type: ignore[no-untyped-def]
    (scratch / f"req-{user}.txt").write_text(req)
    prefix = scratch / f"env-{user}-{job_id}"
    call = step_call(
        scratch,
        cfg,
        job_id=job_id,
        uid=uid,
        user=user,
        deps=f"{prefix},key=req-{user}.txt",
    )
    assert step.prolog(call).outcome == "skipped"  # nothing to restore: the job installs
    installed(call, prefix)
    return call, prefix


def test_a_capture_past_the_scopes_quota_is_skipped_and_writes_nothing(
    scratch: Path, store: Store, store_dir: Path
) -> None:
    needs_root()
    # Room for one install (~200 kB of incompressible data), not two.
    cfg = site(scratch, quota={"user": 300_000})
    call, prefix = _job(scratch, cfg, 1, USER_A, "ada", "numpy\n")
    r = step.epilog(call)
    assert r.outcome == "ok" and "captured" in r.detail, r.detail
    used = scope_quota(store, "user/ada", cfg.deps.quota).used
    assert 200_000 < used < 300_000
    before = _files(store_dir)
    # Her next install (another key) starts with room left but would pass the quota.
    call, prefix = _job(scratch, cfg, 2, USER_A, "ada", "scipy\n")
    r = step.epilog(call)
    assert r.outcome == "skipped", r.detail
    assert "larger than the room left" in r.detail and "deps.quota user=300000" in r.detail
    assert "user/ada holds" in r.detail
    assert _files(store_dir) == before  # no archive, manifest, ref or temporary object
    # Once the scope is full, the next capture does not even start.
    store.write_bytes("deps/user/ada/filler", b"x" * (300_000 - used))
    before = _files(store_dir)
    call, prefix = _job(scratch, cfg, 3, USER_A, "ada", "pandas\n")
    r = step.epilog(call)
    assert r.outcome == "skipped" and "not captured" in r.detail, r.detail
    assert _files(store_dir) == before
    # Another user's scope has its own quota.
    call, prefix = _job(scratch, cfg, 4, USER_B, "bea", "numpy\n")
    r = step.epilog(call)
    assert r.outcome == "ok" and "captured" in r.detail, r.detail
    shutil.rmtree(prefix)


def test_the_skip_is_in_the_epilogs_phase_rows(scratch: Path, store: Store) -> None:
    """Through the hook runner: the deps_capture row is a skip that names the quota."""
    needs_root()
    from bootseer.hooks.runner import run_steps

    cfg = site(scratch, quota={"user": 1000})
    call, _ = _job(scratch, cfg, 1, USER_A, "ada", "numpy\n")
    run = run_steps("epilog", call.ctx, call.cfg, call.job, call.log)
    rows = {r.phase: r for r in run.phase_rows("epilog", began=None, now=time.time())}
    row = rows["deps_capture"]
    assert row.outcome == "skipped", row
    assert "not captured" in row.detail and "deps.quota user=1000" in row.detail, row.detail
    assert rows["epilog"].outcome == "ok"  # a skip, not a failure
    assert not store.list("deps/user/ada", recursive=True)


def test_quota_is_a_site_setting_per_kind_of_scope(scratch: Path) -> None:
    cfg = site(scratch)
    assert cfg.deps.quota == {"user": 256 << 30, "account": 2 << 40, "cluster": 2 << 40}
    cfg = site(scratch, quota={"user": 5})
    assert cfg.deps.quota == {"user": 5, "account": 2 << 40, "cluster": 2 << 40}
    assert site(scratch, quota={"cluster": 0}).deps.quota["cluster"] == 0  # no quota
    with pytest.raises(ConfigError, match=r"deps\.quota\.group"):
        site(scratch, quota={"group": 5})
    with pytest.raises(ConfigError, match="must not be negative"):
        site(scratch, quota={"user": -1})


def test_no_quota_lists_nothing(scratch: Path, store: Store) -> None:
    store.write_bytes("deps/cluster/" + "1" * 32 + "/manifest.json", b"x" * 100)
    q = scope_quota(store, "cluster", {"cluster": 0})
    assert q.room is None and q.used == 0
    q = scope_quota(store, "cluster", {"cluster": 150})
    assert q.room == 50 and q.used == 100
