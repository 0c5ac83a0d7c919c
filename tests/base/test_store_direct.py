"""file:// stores: writes and reads past the page cache, and the buffers reads reuse."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from bootseer.directio import Buffers
from bootseer.store import open_store

SIZES = [0, 1, 4095, 4096, 4097, 3 * 4096 + 5, 1 << 20]


@pytest.mark.parametrize("size", SIZES)
def test_direct_round_trip(tmp_path: Path, size: int) -> None:
    store = open_store(f"file://{tmp_path}/store")
    data = os.urandom(size)
    store.write_bytes("u/v/0", data, atomic=False, direct=True)
    path = tmp_path / "store/u/v/0"
    assert path.read_bytes() == data
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # a unit is root's alone, as before
    assert bytes(store.read_direct("u/v/0")) == data
    assert bytes(store.read_direct("u/v/0", Buffers(2))) == data
    assert store.read_bytes("u/v/0") == data
    assert store.read_bytes("u/v/0", limit=3) == data[:3]
    # Written again shorter: nothing of the longer version is left.
    store.write_bytes("u/v/0", data[: size // 2], atomic=False, direct=True)
    assert bytes(store.read_direct("u/v/0")) == data[: size // 2]


def test_missing_key_is_file_not_found_read_direct(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    with pytest.raises(FileNotFoundError, match="nope: not found"):
        store.read_direct("nope")
    with pytest.raises(FileNotFoundError, match="nope: not found"):
        store.read_bytes("nope")


@pytest.mark.skipif(shutil.which("fincore") is None, reason="needs util-linux fincore")
def test_direct_write_leaves_no_page_cache(tmp_path: Path) -> None:
    """The point of ``direct``: a unit's whole blocks do not fill this node's page cache
    (the kernel's copy into fresh pages was the daemon's biggest cost per byte)."""
    store = open_store(f"file://{tmp_path}/store")
    store.write_bytes("d", b"x" * (1 << 20), atomic=False, direct=True)
    store.write_bytes("b", b"x" * (1 << 20), atomic=False)

    def cached(name: str) -> int:
        path = str(tmp_path / "store" / name)
        out = subprocess.run(
            ["fincore", "--bytes", "--noheadings", "--output", "RES", path],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        return int(out.split()[0])

    if cached("b") == 0:
        pytest.skip("this filesystem keeps no page cache for the buffered write either")
    assert cached("d") == 0


@pytest.mark.parametrize(
    ("offset", "length"), [(0, 1 << 20), (5, 3), (4095, 2), (4096, 8192), (100, (1 << 20) - 100)]
)
def test_read_range_of_a_file_store(tmp_path: Path, offset: int, length: int) -> None:
    """A piece's range, read past the page cache from any offset (O_DIRECT reads whole
    blocks from a block: the range's own bytes come back), and fewer where the file ends."""
    store = open_store(f"file://{tmp_path}/store")
    data = os.urandom((1 << 20) + 7)
    store.write_bytes("p", data)
    assert store.read_range("p", offset, length) == data[offset : offset + length]
    assert store.read_range("p", len(data) - 3, 10) == data[-3:]
    assert store.read_range("p", 0, 0) == b""
    with pytest.raises(FileNotFoundError, match="nope: not found"):
        store.read_range("nope", 0, 10)


@pytest.mark.skipif(shutil.which("fincore") is None, reason="needs util-linux fincore")
def test_read_range_leaves_no_page_cache(tmp_path: Path) -> None:
    """The node agent reads a piece (a checkpoint unit from a ``file://`` target, a
    block or frame from the main store) with ``read_range`` once and keeps it in its own
    cache; the job's mount holds it next. The store file's pages would be a second copy
    of the bytes on the node: none are left (issue 19)."""
    store = open_store(f"file://{tmp_path}/store")
    data = os.urandom(4 << 20)
    store.write_bytes("u", data, atomic=False, direct=True)
    path = tmp_path / "store" / "u"
    assert _fincore(path) == 0
    assert store.read_range("u", 0, len(data)) == data
    assert store.read_range("u", 12345, 1 << 20) == data[12345 : 12345 + (1 << 20)]
    assert _fincore(path) == 0
    # Where the filesystem does keep pages for a buffered read (what read_range did).
    with open(path, "rb") as f:
        f.read()
    if _fincore(path) == 0:
        pytest.skip("this filesystem keeps no page cache for a buffered read either")


def _fincore(path: Path) -> int:
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return int(out.split()[0])


def test_buffers_are_reused_only_when_no_view_is_left() -> None:
    buffers = Buffers(keep=4)
    a = buffers.get(8192)
    view = memoryview(a)[:100]
    buffers.retire(memoryview(a))
    del a
    b = buffers.get(8192)
    assert b is not view.obj  # a view of the retired buffer is alive: a fresh one
    view.release()
    del view
    c = buffers.get(8192)
    assert len(c) >= 8192 and len(c) % 4096 == 0
    buffers.retire(memoryview(c))
    cid = id(c)
    del c
    assert id(buffers.get(4096)) == cid  # nothing holds it: taken again


def test_buffers_keep_at_most_keep() -> None:
    buffers = Buffers(keep=2)
    bufs = [buffers.get(4096) for _ in range(5)]
    for b in bufs:
        buffers.retire(memoryview(b))
    assert len(buffers._free) == 2


def test_buffers_take_back_only_their_own_once() -> None:
    # A pool that took another pool's buffer (a checkpoint reader dropping a piece the
    # peers' way read) would hold a reference the other does not count: neither would
    # ever reuse it.
    mine, other = Buffers(keep=4), Buffers(keep=4)
    theirs = other.get(4096)
    mine.retire(memoryview(theirs))
    assert mine._free == []
    own = mine.get(4096)
    mine.retire(memoryview(own))
    mine.retire(memoryview(own))
    assert len(mine._free) == 1
    oid = id(own)
    del own
    assert id(mine.get(4096)) == oid


def _vm_flags(address: int) -> set[str]:
    """The VmFlags of this process's mapping that holds ``address`` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "VmFlags:":
            return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


def test_big_buffers_ask_for_huge_pages() -> None:
    """A checkpoint unit's buffer (and the aligned one writes go through) is asked to be
    backed by transparent huge pages (``MADV_HUGEPAGE``: the ``hg`` flag): the kernel
    pins it for each O_DIRECT read and each FUSE reply, and faults it in, 2 MiB at a
    time (issue 19: the daemon's CPU per GiB). Small buffers are left as they are."""
    import ctypes
    import mmap

    from bootseer import directio

    def address(buf: mmap.mmap) -> int:
        c = ctypes.c_char.from_buffer(buf)
        try:
            return ctypes.addressof(c)
        finally:
            del c

    buffers = Buffers(keep=2)
    big = buffers.get(8 << 20)
    small = buffers.get(64 << 10)
    assert "hg" in _vm_flags(address(big))
    assert "hg" not in _vm_flags(address(small))
    fd = os.open("/dev/null", os.O_WRONLY)
    try:
        directio.pwrite_padded(fd, b"x" * (4 << 20), 0)  # the thread's aligned buffer
    finally:
        os.close(fd)
    assert "hg" in _vm_flags(address(directio._aligned(4 << 20)))


def test_an_aligned_buffer_is_written_direct_without_a_copy(tmp_path: Path) -> None:
    """A checkpoint unit built in a page-aligned buffer goes to the target with O_DIRECT
    from where it is: the thread's aligned copy buffer is never made (issue 19)."""
    import threading

    from bootseer import directio

    data = os.urandom(3 << 20)
    buf = Buffers(keep=1).get(len(data))
    buf[: len(data)] = data
    store = open_store(f"file://{tmp_path}/store")
    made: list[object] = []

    def write() -> None:
        store.write_bytes("u", memoryview(buf)[: len(data)], atomic=False, direct=True)
        made.append(getattr(directio._direct_buf, "buf", None))

    t = threading.Thread(target=write)
    t.start()
    t.join()
    assert made == [None]
    assert _fincore(tmp_path / "store" / "u") == 0  # past the page cache all the same
    assert (tmp_path / "store" / "u").read_bytes() == data
