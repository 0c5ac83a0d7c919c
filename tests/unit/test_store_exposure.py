"""``bootseer doctor``'s store exposure check on a file:// store: users reach phases/
only (docs/security.md); a store written before private modes is flagged."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bootseer import doctor
from bootseer.store import open_store
from bootseer.store.exposure import exposure

from .test_doctor import make_node


def test_a_store_written_today_exposes_nothing(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        store = open_store(f"file://{tmp_path}/store")
        os.chmod(store.root, 0o755)
        store.write_bytes("deps/user/ada/k/manifest.json", b"x")
        store.write_bytes("images/blocks/ab/abcd", b"x")
        store.write_bytes("phases/day=2026-11-24/a.parquet", b"x")
    finally:
        os.umask(old)
    assert exposure(store) == []
    node = make_node(tmp_path, store={"uri": f"file://{tmp_path}/store"})
    check = doctor.check_store_exposure(node)
    assert check.status == "ok" and "other users reach phases/ only" in check.detail


@pytest.mark.parametrize(("top", "mode"), [("deps", 0o755), ("images", 0o711), ("", 0o777)])
def test_an_old_or_open_directory_is_a_problem(tmp_path: Path, top: str, mode: int) -> None:
    store = open_store(f"file://{tmp_path}/store")
    store.write_bytes("deps/user/ada/k/manifest.json", b"x")
    store.write_bytes("images/blocks/ab/abcd", b"x")
    os.chmod(os.path.join(store.root, top) if top else store.root, mode)
    found = exposure(store)
    assert len(found) == 1 and f"mode {mode:04o}" in found[0], found
    node = make_node(tmp_path, store={"uri": f"file://{tmp_path}/store"})
    check = doctor.check_store_exposure(node)
    assert check.status == "problem" and "chmod -R go-rwx" in check.fix
