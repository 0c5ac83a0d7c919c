"""The node's copies of sealed records (issue 24, item 5): read from the store once,
checked at every use, and what serves a job while the store hangs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer.recordcache import RecordCache
from bootseer.sitekey import SiteKeys
from bootseer.store import Store
from tests.conftest import devcluster
from tests.storeproxy import CountingProxy, proxied_store

KEYS = SiteKeys([b"k" * 32])
LIMIT = 1 << 20


def put(store: Store, key: str, body: bytes, purpose: str = "deps.manifest") -> bytes:
    raw = KEYS.seal(purpose, key, body)  # type: ignore[arg-type]
    store.write_bytes(key, raw)
    return raw


def test_a_copy_altered_on_the_node_is_refused_and_read_again(store: Store, tmp_path: Path) -> None:
    records = RecordCache(tmp_path / "records")
    raw = put(store, "deps/user/a/k/manifest.json", b'{"frames":[1]}')
    assert records.fixed(store, "deps/user/a/k/manifest.json", LIMIT, "deps.manifest", KEYS) == raw
    (copy,) = (tmp_path / "records").iterdir()
    copy.write_bytes(raw.replace(b"[1]", b"[2]"))  # same length, another body
    assert records.held("deps/user/a/k/manifest.json", "deps.manifest", KEYS) is None
    assert not copy.exists()  # forgotten
    assert records.fixed(store, "deps/user/a/k/manifest.json", LIMIT, "deps.manifest", KEYS) == raw
    assert copy.read_bytes() == raw


def test_a_copy_is_good_for_its_own_key_and_purpose_only(store: Store, tmp_path: Path) -> None:
    records = RecordCache(tmp_path / "records")
    raw = put(store, "deps/user/a/k/manifest.json", b'{"x":1}')
    records.fixed(store, "deps/user/a/k/manifest.json", LIMIT, "deps.manifest", KEYS)
    (copy,) = (tmp_path / "records").iterdir()
    # Put where another key's copy would be: it does not open there.
    other = records._path("deps/user/b/k/manifest.json")
    other.write_bytes(raw)
    assert records.held("deps/user/b/k/manifest.json", "deps.manifest", KEYS) is None
    assert records.held("deps/user/a/k/manifest.json", "image.manifest", KEYS) is None
    # Under a key since dropped from the key file: refused as well.
    copy.write_bytes(raw)
    assert (
        records.held("deps/user/a/k/manifest.json", "deps.manifest", SiteKeys([b"n" * 32])) is None
    )
    assert not copy.exists()


def test_unsealed_bytes_from_the_store_are_not_kept(store: Store, tmp_path: Path) -> None:
    records = RecordCache(tmp_path / "records")
    store.write_bytes("deps/user/a/k/manifest.json", b'{"planted":1}')
    got = records.fixed(store, "deps/user/a/k/manifest.json", LIMIT, "deps.manifest", KEYS)
    assert got == b'{"planted":1}'  # the caller opens it, and refuses it
    assert not (tmp_path / "records").exists() or not list((tmp_path / "records").iterdir())


def test_a_record_gone_from_the_store_is_gone_from_the_node(store: Store, tmp_path: Path) -> None:
    records = RecordCache(tmp_path / "records")
    put(store, "deps/user/a/ref.json", b'{"key":"1"}', "deps.ref")
    records.latest(store, "deps/user/a/ref.json", LIMIT, "deps.ref", KEYS)
    store.delete("deps/user/a/ref.json")
    with pytest.raises(FileNotFoundError):
        records.latest(store, "deps/user/a/ref.json", LIMIT, "deps.ref", KEYS)
    assert records.held("deps/user/a/ref.json", "deps.ref", KEYS) is None


def test_the_oldest_copies_go_past_the_bound(store: Store, tmp_path: Path) -> None:
    records = RecordCache(tmp_path / "records", max_bytes=3000)
    for i in range(5):
        key = f"images/manifests/{i}.json"
        put(store, key, b'{"b":"' + b"x" * 900 + b'"}', "image.manifest")
        records.fixed(store, key, LIMIT, "image.manifest", KEYS)
        os.utime(records._path(key), (i, i))  # used in this order
    held = [i for i in range(5) if records._path(f"images/manifests/{i}.json").exists()]
    assert held == [3, 4] or held == [2, 3, 4], held


@pytest.fixture
def proxied(s3_store: devcluster.Cluster) -> Iterator[tuple[Store, CountingProxy]]:
    with proxied_store(s3_store.store_uri(), s3_store.secrets_file) as got:
        yield got


@pytest.mark.s3
def test_a_manifest_is_read_from_the_store_once_per_node(
    proxied: tuple[Store, CountingProxy], tmp_path: Path
) -> None:
    store, proxy = proxied
    key = f"deps/user/a/{os.getpid()}/manifest.json"
    raw = put(store, key, b'{"frames":' + b"[1]," * 1000 + b"[1]}")
    records = RecordCache(tmp_path / "records")
    before = proxy.requests
    assert records.fixed(store, key, LIMIT, "deps.manifest", KEYS) == raw
    assert proxy.requests > before
    before = proxy.requests
    assert records.fixed(store, key, LIMIT, "deps.manifest", KEYS) == raw
    assert proxy.requests == before  # the node's copy: not a request
    store.delete(key)


@pytest.mark.s3
def test_a_hung_store_gets_the_nodes_copy_of_a_rewritten_record(
    proxied: tuple[Store, CountingProxy], tmp_path: Path
) -> None:
    store, proxy = proxied
    key = f"deps/user/a/{os.getpid()}-ref.json"
    records = RecordCache(tmp_path / "records")
    put(store, key, b'{"key":"1"}', "deps.ref")
    records.latest(store, key, LIMIT, "deps.ref", KEYS, wait=60)
    new = put(store, key, b'{"key":"2"}', "deps.ref")
    assert records.latest(store, key, LIMIT, "deps.ref", KEYS, wait=60) == new  # the store's
    gone = f"deps/user/a/{os.getpid()}-gone.json"
    with pytest.raises(FileNotFoundError):
        records.latest(store, gone, LIMIT, "deps.ref", KEYS, wait=60)
    proxy.hang()
    try:
        assert records.latest(store, key, LIMIT, "deps.ref", KEYS, wait=0.5) == new
        with pytest.raises(FileNotFoundError):  # none when last asked: none now either
            records.latest(store, gone, LIMIT, "deps.ref", KEYS, wait=0.5)
    finally:
        proxy.resume()
    store.delete(key)
