"""The S3 store host: a real SeaweedFS behind a rate-capped veth link."""

from __future__ import annotations

import os
import subprocess
import time

import devcluster
import pytest

from bootseer.store import open_store

pytestmark = pytest.mark.s3


def test_s3_store_round_trip(s3_store: devcluster.Cluster) -> None:
    store = open_store(s3_store.store_uri())
    store.write_bytes("probe/a.bin", b"abc" * 1000)
    assert store.read_bytes("probe/a.bin") == b"abc" * 1000
    assert [o.key for o in store.list("probe")] == ["probe/a.bin"]
    with pytest.raises(RuntimeError), store.writer("probe/b.bin") as out:
        out.write(b"partial")
        raise RuntimeError("crash")
    assert not store.exists("probe/b.bin")


def test_store_link_is_capped(s3_store: devcluster.Cluster) -> None:
    """A transfer over the link takes at least as long as the cap allows (10% margin)."""
    store = open_store(s3_store.store_uri())
    size = 8 * 1024 * 1024
    store.write_bytes("probe/cap.bin", os.urandom(size))
    t0 = time.monotonic()
    data = store.read_bytes("probe/cap.bin")
    secs = time.monotonic() - t0
    assert len(data) == size
    mbit = size * 8 / secs / 1e6
    print(f"store link: {mbit:.1f} Mbit/s measured against a cap of {s3_store.s.store_mbit}")
    assert mbit <= s3_store.s.store_mbit * 1.1
    # The cap is a cap, not a stall: the link carries at least half of it.
    assert mbit >= s3_store.s.store_mbit * 0.5


def test_store_host_is_in_its_own_namespace(s3_store: devcluster.Cluster) -> None:
    r = subprocess.run(
        ["ip", "netns", "exec", s3_store.s.netns, "ip", "-o", "addr"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert s3_store.s.store_ips[1] in r.stdout
    # weed serves in the namespace only: its address is not on the host.
    host = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    assert s3_store.s.store_ips[1] not in host
