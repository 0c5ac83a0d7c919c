"""The checkpoint writer's out-of-order patterns against real S3 targets (SeaweedFS):
units read back from the store, patched and uploaded under new names, the replaced
ones deleted (issue 12)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer.ckpt import Namespace
from bootseer.ckpt.stage import Stage
from bootseer.ckpt.writer import StripedWriter
from bootseer.credentials import read_secrets_file
from bootseer.store import open_store
from tests.conftest import devcluster
from tests.sitekeys import KEYS

pytestmark = pytest.mark.s3
UNIT = 64 << 10


@pytest.fixture
def ns(s3_store: devcluster.Cluster) -> Iterator[Namespace]:
    creds = read_secrets_file(s3_store.secrets_file)
    uris = [s3_store.store_uri().replace("/store?", f"/ckpt-patterns-{i}?") for i in range(2)]
    stores = [open_store(u, creds.access_key, creds.secret_key) for u in uris]
    name = f"ada/patterns-{os.getpid()}"
    yield Namespace(stores, name, unit_size=UNIT, keys=KEYS)
    for s in stores:
        s.delete_prefix(name)


def _objects(ns: Namespace) -> set[str]:
    out = set()
    for store in ns.targets:
        for version in store.list_dirs(f"{ns.name}/units"):
            keys = store.list(f"{ns.name}/units/{version}")
            out |= {f"{version}/{o.key.rsplit('/', 1)[-1]}" for o in keys}
    return out


def test_out_of_order_writes_on_s3_targets(ns: Namespace, tmp_path: Path) -> None:
    stage = Stage(tmp_path / "stage", limit=16 * UNIT)
    # safetensors: the size first, then front to back (nothing staged)
    st = os.urandom(5 * UNIT + 11)
    w = StripedWriter(ns, "m.safetensors", stage=stage)
    w.truncate(len(st))
    w.pwrite(0, st)
    assert w.staged_bytes == 0
    w.rename("model.safetensors")  # renamed while open
    w.close()
    # np.savez: a header patched behind the stream; and a gap filled afterwards
    z = bytearray(os.urandom(4 * UNIT + 3))
    w = StripedWriter(ns, "opt.npz", stage=stage)
    w.pwrite(3 * UNIT, z[3 * UNIT :])
    w.pwrite(0, z[: 3 * UNIT])
    w.pwrite(5, b"HEADER")
    z[5:11] = b"HEADER"
    w.close()
    # an update without truncating, then a shrink into what was streamed
    m = ns.manifest("opt.npz")
    assert m is not None
    w = StripedWriter(ns, "opt.npz", base=m, stage=stage)
    w.pwrite(2 * UNIT, b"upd")
    z[2 * UNIT : 2 * UNIT + 3] = b"upd"
    w.close()
    assert w.copied == 3 * UNIT  # units 0, 1 and 3 copied by the S3 server (CopyObject)
    # a shrink into what was streamed, then more
    t = os.urandom(3 * UNIT)
    w = StripedWriter(ns, "trunc.bin", stage=stage)
    w.pwrite(0, t)
    w.truncate(UNIT + 9)
    w.pwrite(UNIT + 9, b"more")
    w.close()
    with ns.open("trunc.bin") as f:
        assert f.read() == t[: UNIT + 9] + b"more"
    with ns.open("model.safetensors") as f:
        assert f.read() == st
    with ns.open("opt.npz") as f:
        assert f.read() == z
    assert ns.manifest("m.safetensors") is None
    named = set()
    for path in ("model.safetensors", "opt.npz", "trunc.bin"):
        mm = ns.manifest(path)
        assert mm is not None
        named |= {f"{mm.version}/{n}" for n, _ in mm.units}
    assert _objects(ns) == named  # nothing replaced is left on the targets
    assert stage.used == 0


def test_directory_rename_symlink_and_append_on_s3_targets(ns: Namespace) -> None:
    """Issue 23 on S3: a directory rename is one PUT of the rename table; the old name
    made again is empty; a link is an object of its own; an append copies the units."""
    for i in range(20):
        with ns.open(f"tmp/sub/f{i}", "wb") as f:
            f.write(b"x%d" % i)
    ns.rename_dir("tmp", "ckpt-1")
    assert [e.name for e in ns.listdir()] == ["ckpt-1"]
    assert sorted(ns.walk()) == sorted(f"ckpt-1/sub/f{i}" for i in range(20))
    ns.mkdir("tmp")
    assert ns.listdir("tmp") == [] and ns.is_dir("tmp")
    with ns.open("tmp/f", "wb") as f:
        f.write(b"two")
    ns.mkdir("ckpt-2")
    ns.rename_dir("tmp", "ckpt-2")  # onto an empty directory
    assert [e.name for e in ns.listdir()] == ["ckpt-1", "ckpt-2"]
    ns.symlink("latest", "ckpt-2")
    assert ns.node("latest") is not None and ns.manifest("latest") is None
    with ns.open("ckpt-2/f") as f:
        assert f.read() == b"two"
    for path in list(ns.walk("ckpt-1")):
        ns.remove(path)
    ns.rmdir("ckpt-1/sub")
    ns.rmdir("ckpt-1")
    assert [e.name for e in ns.listdir()] == ["ckpt-2", "latest"]
    base = ns.manifest("ckpt-2/f")
    assert base is not None
    w = StripedWriter(ns, "ckpt-2/f", base=base)  # what an append opens
    w.pwrite(base.size, b"+more")
    w.close()
    with ns.open("ckpt-2/f") as f:
        assert f.read() == b"two+more"
