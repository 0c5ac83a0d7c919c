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


def test_keys_named_like_compressed_files_are_stored_verbatim(tmp_path: Path) -> None:
    """pyarrow guesses compression from the extension unless told not to: a snapshot's
    ``.zst`` must hold exactly the bytes written, not a zstd frame around them."""
    store = open_store(f"file://{tmp_path}/store")
    store.write_bytes("snap/archive.tar.zst", b"already zstd")
    assert (tmp_path / "store/snap/archive.tar.zst").read_bytes() == b"already zstd"
    assert store.read_bytes("snap/archive.tar.zst") == b"already zstd"


def test_directories(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    store.make_dir("ns/files/a/b")
    assert store.is_dir("ns/files/a") and store.is_dir("ns/files/a/b")
    assert store.list_dirs("ns/files/a") == ["b"]
    assert not store.is_dir("ns/files/c")
    store.write_bytes("ns/files/x", b"1")
    assert not store.is_dir("ns/files/x")
    store.remove_dir("ns/files/a/b")
    assert not store.is_dir("ns/files/a/b")


def test_create_exclusive_stores_the_callers_bytes(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    assert store.create_exclusive("locks/one", b"mine")
    assert not store.create_exclusive("locks/one", b"theirs")
    assert store.read_bytes("locks/one") == b"mine"


def test_storage_is_reached_through_store_only() -> None:
    """Outside bootseer.store, nothing imports its private module (phases' Parquet
    datasets use Store.fs, pyarrow's own filesystem, on purpose)."""
    lib = Path(__file__).resolve().parents[2] / "lib" / "bootseer"
    offenders = [
        str(p.relative_to(lib))
        for p in lib.rglob("*.py")
        if p.parent.name != "store" and "bootseer.store._store" in p.read_text()
    ]
    assert offenders == []
