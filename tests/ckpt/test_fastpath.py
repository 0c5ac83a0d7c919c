"""The mount's per-byte shortcuts: appends without a thread hop, reads as views of the
verified units, unit buffers used again without changing bytes still held."""

from __future__ import annotations

import errno
import os

import pyfuse3
import pytest

from bootseer.ckpt import Namespace
from bootseer.ckpt.manifest import Manifest
from bootseer.ckpt.writer import StripedWriter
from bootseer.ckptd.fs import CkptFS, _Handle
from tests.ckpt.conftest import UNIT


def test_pwrite_nowait_takes_appends_inside_the_unit(ns: Namespace) -> None:
    data = os.urandom(3 * UNIT + 7)
    w = StripedWriter(ns, "a.bin")
    assert w.pwrite_nowait(0, data[:100]) == 100
    assert w.pwrite_nowait(100, data[100 : UNIT - 1]) == UNIT - 101
    # Filling the unit means an upload: not without waiting.
    assert w.pwrite_nowait(UNIT - 1, data[UNIT - 1 : UNIT + 5]) is None
    assert w.pwrite_nowait(200, b"x") is None  # not at the stream's end
    assert w.pwrite_nowait(UNIT + 5, b"x") is None  # a gap
    pos = UNIT - 1
    while pos < len(data):  # the rest as the daemon does: quick where it can, else pwrite
        chunk = data[pos : pos + 1000]
        if w.pwrite_nowait(pos, chunk) is None:
            assert w.pwrite(pos, chunk) == len(chunk)
        pos += len(chunk)
    assert w.size == len(data)
    w.close()
    with ns.open("a.bin") as f:
        assert f.read() == data


def test_pwrite_nowait_leaves_staged_writes_to_pwrite(ns: Namespace, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from bootseer.ckpt.stage import Stage

    stage = Stage(tmp_path / "stage", 64 * UNIT)
    w = StripedWriter(ns, "b.bin", stage=stage)
    w.pwrite(2 * UNIT, b"z" * 10)  # ahead of the stream: staged
    assert w.pwrite_nowait(0, b"a" * 10) is None  # the stream must drain the stage
    w.pwrite(0, b"a" * (2 * UNIT))
    w.close()
    with ns.open("b.bin") as f:
        assert f.read() == b"a" * (2 * UNIT) + b"z" * 10
    stage.close()


def test_the_daemon_writes_appends_in_its_loop_and_respects_the_handle(ns: Namespace) -> None:
    w = StripedWriter(ns, "c.bin")
    h = _Handle(2, "c.bin", writer=w)
    assert CkptFS._write_nowait(h, 0, b"x" * 10) == 10
    with h.lock:  # a commit or upload under way: in turn, through the thread
        assert CkptFS._write_nowait(h, 10, b"y") is None
    h.failed, h.errno = "an upload failed", errno.EDQUOT
    with pytest.raises(pyfuse3.FUSEError) as exc:
        CkptFS._write_nowait(h, 10, b"y")
    assert exc.value.errno == errno.EDQUOT
    h.failed = ""
    w.abort()
    with pytest.raises(pyfuse3.FUSEError) as exc:
        CkptFS._write_nowait(h, 10, b"y")
    assert exc.value.errno == errno.EBADF
    assert ns.manifest("c.bin") is None


def test_reads_are_views_and_reused_buffers_keep_held_bytes(ns: Namespace) -> None:
    data = os.urandom(40 * UNIT + 11)
    with ns.open("d.bin", "wb") as f:
        f.write(data)
    m = ns.manifest("d.bin")
    assert isinstance(m, Manifest)
    r = ns.open("d.bin")
    held = r.pview(5, 100)  # a view of unit 0's buffer, as handed to the kernel
    assert isinstance(held, memoryview) and bytes(held) == data[5:105]
    for off in range(0, len(data), 1000):  # past the reader's cap: units dropped, reused
        got = r.pread_ready(off, 1000)
        if got is None:
            got = r.pview(off, 1000)
        assert bytes(got) == data[off : off + 1000]
    assert bytes(held) == data[5:105]  # its buffer was not read into again
    assert len(r._buffers._free) <= r._buffers.keep
    r.close()


def test_a_read_across_units_is_one_view(ns: Namespace) -> None:
    data = os.urandom(3 * UNIT)
    with ns.open("e.bin", "wb") as f:
        f.write(data)
    r = ns.open("e.bin")
    assert bytes(r.pview(UNIT - 10, 30)) == data[UNIT - 10 : UNIT + 20]
    got = r.pread_ready(UNIT - 10, 30)
    assert got is not None and bytes(got) == data[UNIT - 10 : UNIT + 20]
    assert r.pread(UNIT - 10, 30) == data[UNIT - 10 : UNIT + 20]
    r.close()
