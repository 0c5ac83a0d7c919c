"""The epilog captures only entries that are the job user's own and not writable by
every user: anything else another user could have changed (or put there) before the
capture, and the sealed snapshot would carry it into the user's later jobs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bootseer.deps import step
from bootseer.deps.capture import CaptureError
from bootseer.store import Store

from .conftest import USER_A, USER_B, needs_root, site, step_call
from .test_steps import installed

pytestmark = pytest.mark.root


def _installed(scratch: Path):  # type: ignore[no-untyped-def]
    (scratch / "req.txt").write_text("numpy\n")
    prefix = scratch / "env"
    call = step_call(
        scratch, site(scratch), job_id=1, uid=USER_A, user="ada", deps=f"{prefix},key=req.txt"
    )
    assert step.prolog(call).outcome == "skipped"
    installed(call, prefix)
    return call, prefix


def test_a_file_every_user_may_write_is_not_captured(scratch: Path, store: Store) -> None:
    needs_root()
    call, prefix = _installed(scratch)
    os.chmod(prefix / "bin" / "tool", 0o757)
    with pytest.raises(CaptureError, match=r"bin/tool is writable by every user \(mode 0757\)"):
        step.epilog(call)
    assert not store.list("deps/user/ada", recursive=True)


def test_a_file_of_another_user_is_not_captured(scratch: Path, store: Store) -> None:
    needs_root()
    call, prefix = _installed(scratch)
    os.chown(prefix / "lib" / "pkg" / "mod.py", USER_B, USER_B)
    with pytest.raises(CaptureError, match=f"lib/pkg/mod.py belongs to uid {USER_B}"):
        step.epilog(call)
    assert not store.list("deps/user/ada", recursive=True)


def test_links_and_the_users_own_files_are_captured(scratch: Path, store: Store) -> None:
    needs_root()
    call, prefix = _installed(scratch)
    os.symlink("tool", prefix / "bin" / "alias")  # a link's mode is 0777 and means nothing
    os.chown(prefix / "bin" / "alias", USER_A, USER_A, follow_symlinks=False)
    record = call.job.sub("deps") / "job" / "install.json"
    record.write_text(record.read_text().replace('"bin/tool"', '"bin/alias","bin/tool"'))
    assert "bin/alias" in record.read_text()
    r = step.epilog(call)
    assert r.outcome == "ok" and "captured" in r.detail, r.detail
    (manifest,) = [
        o.key
        for o in store.list("deps/user/ada", recursive=True)
        if o.key.endswith("/manifest.json")
    ]
    assert b'"bin/alias","l"' in store.read_bytes(manifest)


def test_an_empty_lock_file_every_user_may_write_is_captured_empty(
    scratch: Path, store: Store
) -> None:
    """uv makes every venv's `.lock` 0666: refusing it refused every uv install."""
    needs_root()
    call, prefix = _installed(scratch)
    lock = prefix / ".lock"
    lock.touch()
    os.chown(lock, USER_A, USER_A)
    os.chmod(lock, 0o666)
    record = call.job.sub("deps") / "job" / "install.json"
    record.write_text(record.read_text().replace('"bin/tool"', '".lock","bin/tool"'))
    r = step.epilog(call)
    assert r.outcome == "ok" and "captured" in r.detail, r.detail
    (manifest,) = [
        o.key
        for o in store.list("deps/user/ada", recursive=True)
        if o.key.endswith("/manifest.json")
    ]
    assert b'".lock"' in store.read_bytes(manifest)
