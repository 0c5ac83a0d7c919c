"""The Python API: layout, manifests, reader and writer over real file:// targets."""

from __future__ import annotations

import errno
import io
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from bootseer.ckpt import CkptError, CkptIOError, CkptPathError, Namespace, check_path
from bootseer.ckpt.manifest import parse
from bootseer.ckpt.names import namespace_name
from bootseer.ckpt.reader import LATE
from bootseer.errors import ManifestError
from bootseer.store import Store, open_store

from .conftest import UNIT

K = 3
SIZES = [
    0,
    1,
    100,
    UNIT - 1,
    UNIT,
    UNIT + 1,
    2 * UNIT,
    K * UNIT - 1,
    K * UNIT,
    K * UNIT + 1,
    7 * UNIT + 123,
]


def put(ns: Namespace, path: str, data: bytes, chunk: int = 1000) -> None:
    with ns.open(path, "wb") as f:
        for i in range(0, len(data), chunk):
            f.write(data[i : i + chunk])


@pytest.mark.parametrize("size", SIZES)
def test_round_trip_is_byte_identical(ns: Namespace, size: int) -> None:
    data = os.urandom(size)
    put(ns, "d/file.bin", data)
    m = ns.manifest("d/file.bin")
    assert m is not None and m.size == size and m.unit_count == -(-size // UNIT)
    with ns.open("d/file.bin") as f:
        assert f.read() == data
    with ns.open("d/file.bin") as f:
        got = bytearray()
        while chunk := f.read(777):
            got += chunk
        assert got == data


def test_units_go_round_robin_over_the_targets(ns: Namespace, tmp_path: Path) -> None:
    put(ns, "f", os.urandom(5 * UNIT))
    m = ns.manifest("f")
    assert m is not None
    for i in range(5):
        unit = tmp_path / f"t{i % K}" / "ada/test/units" / m.version / str(i)
        assert unit.stat().st_size == UNIT
    assert (tmp_path / "t0/ada/test/files/f").exists()
    assert not (tmp_path / "t1/ada/test/files").exists()


def test_seek_tell_readinto_across_unit_boundaries(ns: Namespace) -> None:
    data = os.urandom(4 * UNIT + 10)
    put(ns, "f", data)
    with ns.open("f") as f:
        assert f.seekable() and f.readable() and not f.writable()
        f.seek(UNIT - 5)
        buf = bytearray(UNIT + 10)
        assert f.readinto(buf) == UNIT + 10
        assert buf == data[UNIT - 5 : 2 * UNIT + 5]
        assert f.tell() == 2 * UNIT + 5
        f.seek(-3, io.SEEK_END)
        assert f.read(100) == data[-3:]
        assert f.read(100) == b""
        f.seek(10, io.SEEK_SET)
        f.seek(5, io.SEEK_CUR)
        assert f.read(3) == data[15:18]
        assert f.pread(3 * UNIT - 1, 2) == data[3 * UNIT - 1 : 3 * UNIT + 1]
    with ns.open("f") as raw, io.BufferedReader(raw, 1000) as buffered:
        assert buffered.read() == data


def test_concurrent_readers(ns: Namespace) -> None:
    data = os.urandom(9 * UNIT + 17)
    put(ns, "f", data)
    errors: list[BaseException] = []
    shared = ns.open("f")

    def own_reader(seed: int) -> None:
        try:
            with ns.open("f") as f:
                f.seek(seed * 100)
                assert f.read() == data[seed * 100 :]
        except BaseException as exc:
            errors.append(exc)

    def shared_pread(seed: int) -> None:
        try:
            for off in range(seed * 37, len(data), 1500):
                assert shared.pread(off, 1500) == data[off : off + 1500]
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=fn, args=(i,))
        for i in range(6)
        for fn in (own_reader, shared_pread)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    shared.close()
    assert not errors


def test_reader_memory_is_bounded(ns: Namespace) -> None:
    put(ns, "f", os.urandom(40 * UNIT))
    with ns.open("f") as f:
        while f.read(UNIT // 2):
            assert len(f._units) <= ns.read_ahead + 4


def test_a_late_read_keeps_its_unit_and_the_read_ahead(ns: Namespace) -> None:
    """The FUSE daemon gets a sequential reader's reads several at once; one whose unit
    is still coming waits for a thread while the later ones are served. Pinned as it
    arrives, its unit stays while they go past it, and it neither fetches the unit again
    nor turns the read-ahead back (a 100 Mbit/s start fetched 14 of 32 units twice)."""
    body = os.urandom(16 * UNIT)
    put(ns, "f", body)

    def unit(i: int) -> bytes:
        return body[i * UNIT : (i + 1) * UNIT]

    with ns.open("f") as f:
        assert f.pread(0, 100) == body[:100]  # at unit 0: units 1-4 on their way
        late = f.pin(2 * UNIT, UNIT)  # a read of unit 2 arrives and waits for a thread
        for i in range(3, 9):  # the reads after it are served meanwhile
            assert f.pview(i * UNIT, UNIT) == unit(i)
        assert f.pview(2 * UNIT, UNIT) == unit(2)  # then the late one
        f.unpin(late)
        for i in range(9, 16):
            assert f.pview(i * UNIT, UNIT) == unit(i)
        assert f.fetched == len(body)  # each unit once
        assert len(f._units) <= ns.read_ahead + 4


def test_reads_that_come_late_are_no_seek_back(ns: Namespace) -> None:
    """Reads of a sequential reader that reach the daemon up to LATE units after later
    ones (as the kernel sent them through FUSE in a 100 Mbit/s start) find their units
    still held, and the read-ahead goes on from the front: each unit is fetched once."""
    body = os.urandom(20 * UNIT)
    put(ns, "f", body)
    with ns.open("f") as f:
        for i in range(20):
            assert f.pview(i * UNIT, UNIT // 2) == body[i * UNIT : i * UNIT + UNIT // 2]
            if i >= LATE:  # the second half of a unit LATE behind, only now
                j = i - LATE
                assert (
                    f.pview(j * UNIT + UNIT // 2, UNIT // 2)
                    == body[j * UNIT + UNIT // 2 : (j + 1) * UNIT]
                )
        assert f.fetched == len(body)


def test_corrupt_unit_is_an_io_error_naming_file_and_unit(ns: Namespace, tmp_path: Path) -> None:
    put(ns, "d/m.pt", os.urandom(3 * UNIT))
    m = ns.manifest("d/m.pt")
    assert m is not None
    unit = tmp_path / "t1/ada/test/units" / m.version / "1"
    raw = bytearray(unit.read_bytes())
    raw[17] ^= 0xFF
    unit.write_bytes(bytes(raw))
    with ns.open("d/m.pt") as f, pytest.raises(OSError) as info:
        f.read()
    assert info.value.errno == errno.EIO
    assert "ada/test:d/m.pt" in str(info.value) and "unit 1" in str(info.value)
    assert "corrupt" in str(info.value)
    problems = ns.verify_file("d/m.pt")
    assert len(problems) == 1 and "unit 1" in problems[0]
    # Checking can be turned off (site config ckpt.verify = false).
    ns.verify = False
    with ns.open("d/m.pt") as f:
        assert len(f.read()) == 3 * UNIT


def test_missing_unit_or_target_is_a_clear_error(ns: Namespace, tmp_path: Path) -> None:
    put(ns, "f", os.urandom(3 * UNIT))
    m = ns.manifest("f")
    assert m is not None
    (tmp_path / "t2/ada/test/units" / m.version / "2").unlink()
    with (
        ns.open("f") as f,
        pytest.raises(CkptIOError, match=r"unit 2 .* missing on target file://"),
    ):
        f.read()
    # A namespace opened without one of the file's targets refuses its manifest.
    short = Namespace(ns.targets[:2], "ada/test", unit_size=UNIT)
    with pytest.raises(CkptError, match="not in the site config's \\[ckpt\\] targets"):
        short.open("f")


def test_exception_in_with_keeps_previous_version(ns: Namespace, tmp_path: Path) -> None:
    old = os.urandom(2 * UNIT + 5)
    put(ns, "f", old)
    with pytest.raises(RuntimeError), ns.open("f", "wb") as f:
        f.write(os.urandom(5 * UNIT))
        raise RuntimeError("saver crashed")
    with ns.open("f") as f:
        assert f.read() == old
    m = ns.manifest("f")
    assert m is not None
    for t in range(K):
        versions = os.listdir(tmp_path / f"t{t}/ada/test/units")
        assert versions == [m.version], "the aborted version's units are deleted"


def test_new_version_replaces_old_and_old_units_are_collected(
    ns: Namespace, tmp_path: Path
) -> None:
    put(ns, "f", os.urandom(4 * UNIT))
    first = ns.manifest("f")
    new = os.urandom(UNIT + 1)
    put(ns, "f", new)
    second = ns.manifest("f")
    assert first is not None and second is not None and first.version != second.version
    with ns.open("f") as f:
        assert f.read() == new
    assert not (tmp_path / "t0/ada/test/units" / first.version).exists()


def test_commit_then_continue_writing(ns: Namespace) -> None:
    w = ns.open("f", "wb")
    w.write(b"a" * (UNIT + 10))
    w.commit()  # what fsync through the mount does
    with ns.open("f") as f:
        assert f.read() == b"a" * (UNIT + 10)
    w.write(b"b" * UNIT)
    w.close()
    with ns.open("f") as f:
        assert f.read() == b"a" * (UNIT + 10) + b"b" * UNIT
    m = ns.manifest("f")
    assert m is not None and [u[0] for u in m.units] == ["0", "1", "2.2"]


def test_pwrite_patches_the_unsent_unit_and_refuses_going_back(ns: Namespace) -> None:
    w = ns.open("f", "wb")
    w.write(b"x" * (UNIT + 8))
    w.pwrite(UNIT + 2, b"YY")
    w.pwrite(UNIT + 20, b"Z")  # past the end: zero-filled
    with pytest.raises(CkptIOError, match="front to back"):
        w.pwrite(5, b"no")
    w.close()
    with ns.open("f") as f:
        assert f.read() == b"x" * (UNIT + 2) + b"YY" + b"x" * 4 + bytes(12) + b"Z"


WRITER = """
import sys, time
from bootseer.ckpt import Namespace
from bootseer.store import Store, open_store
ns = Namespace([open_store(u) for u in sys.argv[1:]], "ada/test", unit_size={unit})
f = ns.open("f", "wb")
f.write(b"n" * 3 * {unit})
print("writing", flush=True)
while True:
    f.write(b"n" * {unit})
    print("wrote", flush=True)
    time.sleep(0.01)  # a writer still busy when it is killed: the behaviour under test
"""


def test_kill_during_write_leaves_previous_version(ns: Namespace, targets: list[str]) -> None:
    old = os.urandom(3 * UNIT + 1)
    put(ns, "f", old)
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER.format(unit=UNIT), *targets], stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"writing\n"
        # Killed in the middle of its stream: a few more units written after the first.
        assert [proc.stdout.readline() for _ in range(3)] == [b"wrote\n"] * 3
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with ns.open("f") as f:
        assert f.read() == old
    # The dead writer's units are orphans; gc removes them (here: at any age).
    assert ns.gc(min_age=0) == 1
    with ns.open("f") as f:
        assert f.read() == old


@pytest.mark.parametrize(
    "path",
    [
        *("../x", "/etc/passwd", "a/../../b", "a//b", "", "a/./b", ".tmp-x", "a b", "a\nb"),
        "x" * 300,
        *("model.pt\n", "a\n/b"),  # a check by re's $ let a last newline through
    ],
)
def test_path_injection_is_refused(ns: Namespace, path: str) -> None:
    with pytest.raises(CkptPathError):
        check_path(path)
    with pytest.raises(CkptPathError):
        ns.open(path, "wb")


@pytest.mark.parametrize(
    ("user", "name"),
    [
        ("ada", "../bob/x"),
        ("ada", "/abs"),
        ("..", "x"),
        ("ada", "a/../../b"),
        ("ada", ""),
        ("a/b", "x"),
        ("ada\n", "x"),
        ("ada", "x\n"),
    ],
)
def test_namespace_injection_is_refused(user: str, name: str) -> None:
    with pytest.raises(CkptPathError):
        namespace_name(user, name)


def test_manifest_is_checked(ns: Namespace) -> None:
    put(ns, "f", os.urandom(UNIT + 1))
    m = ns.manifest("f")
    assert m is not None
    allowed = frozenset(ns.by_uri)
    good = json.loads(m.to_json())
    for bad in (
        {"units": [["0", "00" * 32], ["../x", "00" * 32]]},
        {"targets": ["file:///etc"]},
        {"size": -1},
        {"version": "../../x"},
        {"unit_size": 0},
        {"units": [["0", "zz"], ["1", "00" * 32]]},
    ):
        with pytest.raises(ManifestError):
            parse(json.dumps({**good, **bad}).encode(), allowed)
    with pytest.raises(ManifestError):
        parse(b"not json", allowed)


def test_listdir_rename_remove(ns: Namespace) -> None:
    put(ns, "a/b/one", b"1")
    put(ns, "a/two", b"22")
    ns.mkdir("a/empty")
    assert [(e.name, e.is_dir) for e in ns.listdir("a")] == [
        ("b", True),
        ("empty", True),
        ("two", False),
    ]
    assert sorted(ns.walk()) == ["a/b/one", "a/two"]
    ns.rename("a/two", "a/b/three")
    with ns.open("a/b/three") as f:
        assert f.read() == b"22"
    assert ns.manifest("a/two") is None
    ns.remove("a/b/three")
    with pytest.raises(FileNotFoundError):
        ns.open("a/b/three")
    with pytest.raises(OSError, match="not empty"):
        ns.rmdir("a/b")
    ns.rmdir("a/empty")


def test_a_directory_is_no_file_whatever_the_stores_error_text(ns: Namespace) -> None:
    """A directory's name is no file (None, then ``is_dir``), told by the store's file
    type: reading a directory fails with a text of the store's own. pyarrow's local
    filesystem says "... is a directory"; its in-memory one (and S3's) "Not a regular
    file", which a decision by that text took for a damaged manifest (EIO)."""
    ns.mkdir("run/step100")
    mem = pafs._MockFileSystem()
    on_mem = Namespace([Store("mem://t", mem, "t")], "ada/run", unit_size=UNIT)
    on_mem.mkdir("run/step100")
    with pytest.raises(OSError, match="Not a regular file"):
        mem.open_input_stream(f"t/{on_mem.manifest_key('run/step100')}")
    for n in (ns, on_mem):
        for path in ("run", "run/step100"):
            assert n.manifest(path) is None, (n, path)
            assert n.is_dir(path)
        with pytest.raises(FileNotFoundError):
            n.open("run/step100")
        with pytest.raises(IsADirectoryError):
            n.open("run/step100", "wb")


def test_torch_load_through_the_reader(ns: Namespace) -> None:
    torch = pytest.importorskip("torch")
    state = {"w": torch.arange(10_000, dtype=torch.float32), "b": torch.ones(3, 5)}
    with ns.open("model.pt", "wb") as f:
        torch.save(state, f)
    with ns.open("model.pt") as f:
        loaded = torch.load(f, weights_only=True)
    assert torch.equal(loaded["w"], state["w"]) and torch.equal(loaded["b"], state["b"])


def test_from_config_names_an_unreachable_target(tmp_path: Path) -> None:
    from bootseer.config import SiteConfig

    blocker = tmp_path / "file"
    blocker.write_text("x")
    cfg = SiteConfig.from_mapping({"ckpt": {"targets": [f"file://{blocker}/t"]}})
    with pytest.raises(CkptError, match=f"target file://{blocker}/t is not reachable"):
        Namespace.from_config(cfg, "ada/x")


def test_open_store_by_uri(targets: list[str]) -> None:
    assert open_store(targets[0]).uri == targets[0]


def test_units_are_built_in_buffers_used_again(ns: Namespace) -> None:
    """A stream of many units is built in a few page-aligned buffers, each used again once
    its unit is uploaded (issue 19: a fresh ``bytearray`` per unit, grown by reallocation
    and copied once more into an aligned buffer for ``O_DIRECT``, cost the daemon CPU per
    GiB); the bytes are the ones written, a partial last unit and all."""
    data = os.urandom(20 * UNIT + 5)
    with ns.open("many.bin", "wb") as f:
        for i in range(0, len(data), 4096):
            f.write(data[i : i + 4096])
        made = f._buffers.made  # type: ignore[attr-defined]
    assert made <= ns.max_inflight + 3, made
    with ns.open("many.bin") as f:
        assert f.read() == data
