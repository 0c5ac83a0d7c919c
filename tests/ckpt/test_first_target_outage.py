"""An outage of a namespace's first target (where its manifests and rename table live)
costs a mount daemon no file its node has read before (issue 24): the node's sealed copy
serves, checked under the site keys. The first target is real S3 (SeaweedFS) through a
proxy the test hangs; the second a directory."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer.ckpt import Namespace
from bootseer.recordcache import RecordCache
from bootseer.store import Store, open_store
from tests.conftest import devcluster
from tests.sitekeys import KEYS
from tests.storeproxy import CountingProxy, proxied_store

pytestmark = pytest.mark.s3
UNIT = 64 << 10


@pytest.fixture
def first(s3_store: devcluster.Cluster) -> Iterator[tuple[Store, CountingProxy]]:
    uri = s3_store.store_uri().replace("/store?", "/ckpt-outage?")
    with proxied_store(uri, s3_store.secrets_file) as (store, proxy):
        yield store, proxy
        proxy.resume()


def namespace(first: Store, second: Store, name: str, records: RecordCache | None) -> Namespace:
    ns = Namespace([first, second], name, unit_size=UNIT, keys=KEYS)
    ns.records = records
    ns.tree_ttl = 0  # read the rename table every time, as a late lookup would
    return ns


def test_a_hung_first_target_costs_no_manifest_the_node_read(
    first: tuple[Store, CountingProxy], tmp_path: Path
) -> None:
    store, proxy = first
    second = open_store(f"file://{tmp_path}/t2")
    name = f"ada/outage-{os.getpid()}"
    data = os.urandom(2 * UNIT + 5)  # units 0 and 2 on the first target, 1 on the second
    writer = namespace(store, second, name, None)
    try:
        writer.mkdir("run")
        writer.rename_dir("run", "run2")  # a rename table on the first target
        with writer.open("run2/model.bin", "wb") as f:
            f.write(data)
        # The mount daemon of a job on this node reads the file's manifest once...
        # (0.5 s: how long the node waits on the target before its copy serves.)
        ns = namespace(store, second, name, RecordCache(tmp_path / "records", wait=0.5))
        m = ns.manifest("run2/model.bin")
        assert m is not None and m.size == len(data)
        proxy.hang()  # ...then the first target stops answering
        assert ns.manifest("run2/model.bin") == m
        with ns.open("run2/model.bin") as r:  # unit 1 lives on the second target
            assert r.pread(UNIT, UNIT) == data[UNIT : 2 * UNIT]
        # (A copy altered on the node is refused: tests/base/test_recordcache.py.)
    finally:
        proxy.resume()
        store.delete_prefix(name)
