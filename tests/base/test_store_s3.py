"""The store's S3 reads against the real S3 store host (SeaweedFS), through a proxy that
counts the HTTP requests the client sends."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from bootseer.store import Store
from tests.conftest import devcluster
from tests.storeproxy import CountingProxy, proxied_store

pytestmark = pytest.mark.s3


@pytest.fixture
def proxied(s3_store: devcluster.Cluster) -> Iterator[tuple[Store, CountingProxy]]:
    with proxied_store(s3_store.store_uri(), s3_store.secrets_file) as got:
        yield got


def test_an_object_is_read_in_one_get(proxied: tuple[Store, CountingProxy]) -> None:
    # pyarrow's S3 stream read to its end in many small ranged GETs: 8x the time and CPU
    # of one GET for a 4 MiB checkpoint unit or image block.
    store, proxy = proxied
    data = os.urandom(4 << 20)
    key = f"bench/one-get-{os.getpid()}"
    store.write_bytes(key, data, atomic=False)
    try:
        before = proxy.requests
        assert store.read_bytes(key) == data
        assert proxy.requests - before <= 2  # the object's size (HEAD), then one GET
        before = proxy.requests
        assert store.read_bytes(key, limit=1000) == data[:1000]
        assert proxy.requests - before <= 2
        before = proxy.requests
        assert store.read_direct(key) == data
        assert proxy.requests - before <= 2
    finally:
        store.delete(key)


def test_a_small_object_is_written_in_one_upload(proxied: tuple[Store, CountingProxy]) -> None:
    # S3 shows an object whole or not at all: a temporary name, its copy and its delete
    # (7x the time per 256 KiB image block) add nothing to an object sent in one upload
    # (pyarrow's: start, one part, complete).
    store, proxy = proxied
    data = os.urandom(256 << 10)
    key = f"bench/one-put-{os.getpid()}"
    try:
        before = proxy.requests
        store.write_bytes(key, data)
        assert proxy.requests - before <= 3
        assert store.read_bytes(key) == data
        assert not [o for o in store.list("bench") if ".tmp-" in o.key]
    finally:
        store.delete(key)
