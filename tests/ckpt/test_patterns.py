"""The writer's write patterns (issue 12): what streams, what is staged, and the bound."""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path

import pytest

from bootseer import digest
from bootseer.ckpt import Namespace
from bootseer.ckpt.errors import StageFullError
from bootseer.ckpt.manifest import Manifest, unit_checksum
from bootseer.ckpt.stage import Stage
from bootseer.ckpt.writer import StripedWriter

from .conftest import UNIT


@pytest.fixture
def stage(tmp_path: Path) -> Stage:
    return Stage(tmp_path / "stage", limit=8 * UNIT)


def _read(ns: Namespace, path: str) -> bytes:
    with ns.open(path) as f:
        return f.read()


def _objects(ns: Namespace) -> set[str]:
    """Every unit object on the targets, as ``<version>/<name>``."""
    out = set()
    for store in ns.targets:
        for version in store.list_dirs(f"{ns.name}/units"):
            out |= {
                f"{version}/{o.key.rsplit('/', 1)[-1]}"
                for o in store.list(f"{ns.name}/units/{version}")
            }
    return out


def _named(ns: Namespace, *paths: str) -> set[str]:
    out = set()
    for p in paths:
        m = ns.manifest(p)
        assert m is not None
        out |= {f"{m.version}/{name}" for name, _ in m.units}
    return out


def test_preallocate_then_write_front_to_back_streams(ns: Namespace, stage: Stage) -> None:
    """safetensors, fio: ftruncate to the final size first; nothing needs staging."""
    data = os.urandom(20 * UNIT + 17)  # more than the stage holds
    w = StripedWriter(ns, "st.safetensors", stage=stage)
    w.truncate(len(data))
    assert w.size == len(data)
    for off in range(0, len(data), 3000):
        w.pwrite(off, data[off : off + 3000])
        assert w.staged_bytes == 0
    w.close()
    assert _read(ns, "st.safetensors") == data
    assert _objects(ns) == _named(ns, "st.safetensors")


def test_a_preallocated_file_written_in_part_is_zero_filled(ns: Namespace, stage: Stage) -> None:
    w = StripedWriter(ns, "f", stage=stage)
    w.truncate(3 * UNIT)
    w.pwrite(0, b"abc")
    w.close()
    assert _read(ns, "f") == b"abc" + bytes(3 * UNIT - 3)


def test_a_gap_is_staged_until_the_stream_reaches_it(ns: Namespace, stage: Stage) -> None:
    head, tail = os.urandom(5 * UNIT + 3), os.urandom(UNIT)
    w = StripedWriter(ns, "f", stage=stage)
    w.pwrite(len(head), tail)
    assert w.staged_bytes == len(tail)
    w.pwrite(0, head)
    assert w.staged_bytes == 0 and stage.used == 0  # drained into the stream
    w.close()
    assert _read(ns, "f") == head + tail


def test_a_gap_never_filled_reads_as_zeros(ns: Namespace, stage: Stage) -> None:
    w = StripedWriter(ns, "f", stage=stage)
    w.pwrite(2 * UNIT + 5, b"end")
    w.pwrite(0, b"start")
    w.close()
    assert _read(ns, "f") == b"start" + bytes(2 * UNIT) + b"end"
    assert stage.used == 0


def test_a_rewrite_behind_the_stream_reuploads_only_its_units(ns: Namespace, stage: Stage) -> None:
    """A zip header patched after its data (np.savez, zipfile)."""
    data = bytearray(os.urandom(6 * UNIT + 9))
    w = StripedWriter(ns, "z", stage=stage)
    w.pwrite(0, data)
    w.pwrite(10, b"HEADER")
    w.pwrite(4 * UNIT - 2, b"acrossunits")
    data[10:16] = b"HEADER"
    data[4 * UNIT - 2 : 4 * UNIT + 9] = b"acrossunits"
    assert w.pread(0, len(data)) == data  # its own writes, before the commit
    w.close()
    assert _read(ns, "z") == data
    m = ns.manifest("z")
    assert m is not None
    assert [n for n, _ in m.units if "." in n] == ["0.1", "3.2", "4.3", "6.4"]
    assert _objects(ns) == _named(ns, "z")  # the replaced units are gone


def test_fsync_then_rewrite_then_close(ns: Namespace, stage: Stage) -> None:
    data = bytearray(os.urandom(3 * UNIT + 1))
    w = StripedWriter(ns, "f", stage=stage)
    w.pwrite(0, data)
    w.commit()
    assert _read(ns, "f") == data
    w.pwrite(1, b"zz")
    data[1:3] = b"zz"
    assert _read(ns, "f") != data  # not before the next commit
    w.close()
    assert _read(ns, "f") == data
    assert _objects(ns) == _named(ns, "f")


def test_truncate_to_zero_then_write_again(ns: Namespace, stage: Stage) -> None:
    w = StripedWriter(ns, "f", stage=stage)
    w.pwrite(0, os.urandom(4 * UNIT))
    w.truncate(0)
    w.pwrite(0, b"second")
    w.close()
    assert _read(ns, "f") == b"second"
    assert _objects(ns) == _named(ns, "f")


def test_truncate_into_what_was_streamed_keeps_the_front(ns: Namespace, stage: Stage) -> None:
    first = os.urandom(4 * UNIT + 100)
    w = StripedWriter(ns, "f", stage=stage)
    w.pwrite(0, first)
    w.truncate(UNIT + 7)
    w.truncate(UNIT + 20)  # grows again: zeros, not the old bytes
    w.pwrite(UNIT + 20, b"more")
    w.close()
    assert _read(ns, "f") == first[: UNIT + 7] + bytes(13) + b"more"
    assert _objects(ns) == _named(ns, "f")


def test_an_update_keeps_what_is_not_written(ns: Namespace, stage: Stage) -> None:
    """Opened without O_TRUNC (r+b, fio's second pass)."""
    old = bytearray(os.urandom(3 * UNIT + 5))
    with ns.open("f", "wb") as f:
        f.write(old)
    before = ns.manifest("f")
    assert before is not None
    w = StripedWriter(ns, "f", base=before, stage=stage)
    assert w.size == len(old) and w.pread(UNIT, 4) == old[UNIT : UNIT + 4]
    w.close()  # untouched: no new version
    assert ns.manifest("f") == before
    w = StripedWriter(ns, "f", base=before, stage=stage)
    w.pwrite(UNIT + 1, b"patch")
    old[UNIT + 1 : UNIT + 6] = b"patch"
    w.close()
    assert _read(ns, "f") == old
    assert _objects(ns) == _named(ns, "f")  # the previous version's units went


def test_an_update_copies_the_units_it_leaves_inside_the_targets(
    ns: Namespace, stage: Stage
) -> None:
    """A few bytes changed in a file opened r+b: the units they do not touch are copied
    from the previous version on their target, not read back and uploaded again (the
    whole file went through the node before). Each version owns its units still."""
    old = bytearray(os.urandom(16 * UNIT + 5))
    with ns.open("f", "wb") as f:
        f.write(old)
    before = ns.manifest("f")
    assert before is not None
    w = StripedWriter(ns, "f", base=before, stage=stage)
    w.pwrite(5 * UNIT + 1, b"patch")
    old[5 * UNIT + 1 : 5 * UNIT + 6] = b"patch"
    read0 = ns.store_bytes
    w.close()
    assert w.copied == 15 * UNIT  # all but the patched unit (the partial last: read)
    assert ns.store_bytes - read0 < 8 * UNIT  # the patched unit and read-ahead, not 16
    after = ns.manifest("f")
    assert after is not None and after.version != before.version
    assert [d for _, d in after.units] == [
        unit_checksum(old[i : i + UNIT]) for i in range(0, len(old), UNIT)
    ]
    assert _read(ns, "f") == old
    assert _objects(ns) == _named(ns, "f")  # the previous version's units went, copies stay
    for store in ns.targets:  # copies are private, as uploads are
        for o in store.list(f"{ns.name}/units", recursive=True):
            assert os.stat(store.path(o.key)).st_mode & 0o077 == 0


def test_staging_is_bounded_and_a_refused_write_keeps_the_old_version(
    ns: Namespace, stage: Stage
) -> None:
    with ns.open("f", "wb") as f:
        f.write(b"previous")
    w = StripedWriter(ns, "f", stage=stage)
    w.pwrite(UNIT, os.urandom(6 * UNIT))  # ahead of the stream: staged
    with pytest.raises(StageFullError, match=r"stage_bytes = 32768") as exc:
        w.pwrite(10 * UNIT, os.urandom(3 * UNIT))
    assert exc.value.errno == errno.ENOSPC
    w.abort()
    assert stage.used == 0
    assert _read(ns, "f") == b"previous"


def test_the_api_writer_still_refuses_going_back(ns: Namespace) -> None:
    """Without a stage (the Python API), units already sent stay as they are."""
    w = ns.open("f", "wb")
    w.write(os.urandom(2 * UNIT))
    with pytest.raises(OSError, match="streams front to back"):
        w.pwrite(0, b"x")
    w.abort()


def test_a_file_renamed_while_open_commits_under_its_new_name(ns: Namespace, stage: Stage) -> None:
    w = StripedWriter(ns, "tmp", stage=stage)
    w.pwrite(0, b"weights")
    w.rename("model.safetensors")
    w.close()
    assert _read(ns, "model.safetensors") == b"weights"
    assert ns.manifest("tmp") is None


def _as_written_before_blake3(ns: Namespace, path: str) -> Manifest:
    """Rewrite ``path``'s manifest as a release before BLAKE3 wrote it: ``checksum``
    ``sha256``, each unit's digest its SHA-256 in bare hex."""
    m = ns.manifest(path)
    assert m is not None
    units = []
    for i, (name, _) in enumerate(m.units):
        unit = ns.store_for(m.target_of(i)).read_bytes(ns.unit_key(m.version, name))
        units.append([name, hashlib.sha256(unit).hexdigest()])
    doc = {
        "format": 1,
        "version": m.version,
        "size": m.size,
        "unit_size": m.unit_size,
        "checksum": "sha256",
        "targets": list(m.targets),
        "units": units,
        "mtime": m.mtime,
    }
    ns.meta.write_bytes(ns.manifest_key(path), json.dumps(doc).encode())
    old = ns.manifest(path)
    assert old is not None and old.checksum == "sha256"
    return old


def test_a_checkpoint_written_with_sha256_units_still_reads_and_an_update_is_blake3(
    ns: Namespace, stage: Stage
) -> None:
    data = bytearray(os.urandom(4 * UNIT + 7))
    with ns.open("f", "wb") as f:
        f.write(data)
    assert ns.manifest("f").checksum == "blake3"  # type: ignore[union-attr]
    old = _as_written_before_blake3(ns, "f")
    assert _read(ns, "f") == data and ns.verify_file("f") == []  # checked by SHA-256
    # A damaged unit of it is still caught.
    unit = ns.unit_key(old.version, old.units[1][0])
    good = ns.store_for(old.target_of(1)).read_bytes(unit)
    ns.store_for(old.target_of(1)).write_bytes(unit, b"\0" + good[1:])
    assert len(ns.verify_file("f")) == 1
    with ns.open("f") as f, pytest.raises(OSError) as info:
        f.read()
    assert info.value.errno == errno.EIO
    ns.store_for(old.target_of(1)).write_bytes(unit, good)
    # Updated in place (r+b): one hash per version, so none of its SHA-256 units is
    # copied; every unit of the new version is named by BLAKE3.
    w = StripedWriter(ns, "f", base=old, stage=stage)
    w.pwrite(2 * UNIT + 1, b"patch")
    data[2 * UNIT + 1 : 2 * UNIT + 6] = b"patch"
    w.close()
    assert w.copied == 0
    new = ns.manifest("f")
    assert new is not None and new.checksum == "blake3"
    assert [d for _, d in new.units] == [
        digest.of(data[i : i + UNIT]) for i in range(0, len(data), UNIT)
    ]
    assert _read(ns, "f") == data and ns.verify_file("f") == []
