from __future__ import annotations

from pathlib import Path

import pytest

from bootseer.errors import StoreError
from bootseer.store import check_key, open_store


def test_round_trip_and_listing(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    store.write_bytes("a/b/c.bin", b"x" * 10)
    store.write_bytes("a/d.bin", b"yy")
    assert store.read_bytes("a/b/c.bin") == b"x" * 10
    assert store.read_range("a/b/c.bin", 2, 3) == b"xxx"
    assert [o.key for o in store.list("a", recursive=True)] == ["a/b/c.bin", "a/d.bin"]
    assert [o.key for o in store.list("a")] == ["a/d.bin"]
    assert store.list_dirs("a") == ["b"]
    assert store.info("a/d.bin").size == 2  # type: ignore[union-attr]
    store.delete("a/d.bin")
    assert not store.exists("a/d.bin")
    assert store.list("missing") == []


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    store.write_bytes("k", b"old")
    with pytest.raises(RuntimeError), store.writer("k") as out:
        out.write(b"new but incomplete")
        raise RuntimeError("crash mid-write")
    assert store.read_bytes("k") == b"old"
    assert [p.name for p in (tmp_path / "store").iterdir()] == ["k"]


def test_missing_key_is_file_not_found(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    with pytest.raises(FileNotFoundError):
        store.read_bytes("nope")


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b", "./a", "a/b c", "a\n"])
def test_unsafe_keys_are_refused(key: str) -> None:
    with pytest.raises(StoreError, match="invalid store key"):
        check_key(key)


def test_unknown_scheme_is_a_store_error() -> None:
    with pytest.raises(StoreError, match="cannot open store"):
        open_store("gopher://x/y")
