"""tensorstore's writes through the real mount as the job's user (Orbax's checkpoint
files are tensorstore's): each key written into ``<key>.__lock``, a file opened twice
(one descriptor locked and written, one to check the lock file is still the one at that
name), fsync'ed, renamed over the key while open; a lock file with nothing to write is
unlinked while still open. Before: ETXTBSY at the second open and EBUSY at the unlink,
each after 2 s of waiting."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bootseer.ckpt import Namespace
from bootseer.ckpt.writer import StripedWriter
from bootseer.ckptd.fs import CkptFS, _Handle

from .conftest import JOB_UID, UNIT, needs_fuse
from .test_clients import as_user, py


def _units(targets: list[str]) -> list[Path]:
    return [p for t in targets for p in Path(t.removeprefix("file://")).rglob("units/*/*")]


@needs_fuse
def test_a_file_open_for_writing_opened_again_is_one_file(
    mounted: tuple[Path, object], job_ns: Namespace
) -> None:
    """A second descriptor joins the writer (same inode, one new version, committed at
    the last close); O_TRUNC through it truncates what the first wrote."""
    mp, _ = mounted
    r = py(
        JOB_UID,
        """
        import fcntl, os, struct, sys
        d = sys.argv[1]
        lock = f"{d}/manifest.ocdbt.__lock"
        a = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
        fcntl.fcntl(a, fcntl.F_OFD_SETLKW, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))
        b = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
        print(os.fstat(a).st_ino == os.fstat(b).st_ino)
        os.close(b)
        os.write(a, b"manifest v1")
        os.fsync(a)
        os.rename(lock, f"{d}/manifest.ocdbt")
        os.close(a)
        # Two writers of one name in one process, the second truncating.
        with open(f"{d}/both", "wb") as f, open(f"{d}/both", "r+b") as g:
            f.write(b"first and long")
            f.flush()
            g.seek(6)
            g.write(b"AND")
        print(open(f"{d}/both", "rb").read().decode().replace(" ", "_"))
        with open(f"{d}/both", "ab") as f, open(f"{d}/both", "wb") as g:
            f.write(b"gone")
            f.flush()
            g.write(b"second")
        """,
        str(mp),
    )
    # A second open that waited for the first's release (which cannot come while the
    # first is open) would have failed ETXTBSY after the wait, and the script with it.
    assert r.stdout.split() == ["True", "first_AND_long"]
    assert sorted(job_ns.walk()) == ["both", "manifest.ocdbt"]
    with job_ns.open("manifest.ocdbt") as f:
        assert f.read() == b"manifest v1"
    with job_ns.open("both") as f:
        assert f.read() == b"second"
    log = as_user(JOB_UID, "cat", f"{mp}/.bootseer.log").stdout
    assert "manifest.ocdbt.__lock: opened for writing again on this node" in log


@needs_fuse
def test_a_killed_process_writing_a_shared_file_leaves_it_to_the_other(
    mounted: tuple[Path, object], job_ns: Namespace
) -> None:
    """A process killed while it holds the second descriptor drops nothing: the other
    process's close commits what both wrote (a killed writer alone still drops its
    version: tests/ckpt/test_mount.py)."""
    mp, _ = mounted
    py(
        JOB_UID,
        """
        import os, signal, sys
        path = f"{sys.argv[1]}/shared.bin"
        a = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(a, b"parent ")
        child = os.fork()
        if child == 0:
            b = os.open(path, os.O_WRONLY)
            os.pwrite(b, b"child ", 7)
            os.kill(os.getpid(), signal.SIGKILL)
        _, status = os.waitpid(child, 0)
        assert os.WTERMSIG(status) == signal.SIGKILL, status
        os.pwrite(a, b"again", 13)
        os.close(a)
        """,
        str(mp),
    )
    with job_ns.open("shared.bin") as f:
        assert f.read() == b"parent child again"


@needs_fuse
def test_unlink_of_a_file_open_for_writing(
    mounted: tuple[Path, object], job_ns: Namespace, targets: list[str]
) -> None:
    """The name goes at once, with what an fsync published under it; the descriptor
    reads and writes on, fstat says no links; the last close commits nothing; the name
    can be made again meanwhile, as a file of its own."""
    mp, _ = mounted
    data = os.urandom(2 * UNIT + 7)
    r = py(
        JOB_UID,
        """
        import os, sys
        d = sys.argv[1]
        lock = f"{d}/k.__lock"
        a = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        os.write(a, bytes.fromhex(sys.argv[2]))
        os.fsync(a)  # published under the lock's name
        os.unlink(lock)
        print(sorted(os.listdir(d)), os.fstat(a).st_nlink, os.fstat(a).st_size)
        with open(lock, "wb") as f:  # the name made again, while the first is open
            f.write(b"new file")
        os.write(a, b"more")
        os.ftruncate(a, 5)
        print(os.pread(a, 5, 0) == bytes.fromhex(sys.argv[2])[:5])
        os.close(a)
        print(sorted(os.listdir(d)), open(lock, "rb").read().decode())
        os.unlink(lock)
        print(sorted(os.listdir(d)))
        """,
        str(mp),
        data.hex(),
    )
    lines = r.stdout.splitlines()
    assert lines == [f"[] 0 {len(data)}", "True", "['k.__lock'] new file", "[]"]
    assert list(job_ns.walk()) == []
    # The units of the version the unlink took the name from went at the close.
    assert _units(targets) == []
    log = as_user(JOB_UID, "cat", f"{mp}/.bootseer.log").stdout
    assert "k.__lock: removed while open for writing" in log


@needs_fuse
def test_tensorstore_file_and_ocdbt_kvstores(mounted: tuple[Path, object]) -> None:
    """tensorstore itself (Orbax's storage): its file kvstore and an OCDBT database on
    it, written and read back through the mount."""
    pytest.importorskip("tensorstore")
    mp, _ = mounted
    r = py(
        JOB_UID,
        """
        import os, sys, numpy as np, tensorstore as ts
        d = sys.argv[1]
        kv = ts.KvStore.open({"driver": "file", "path": f"{d}/kv/"}).result()
        for i in range(3):
            kv.write(f"k{i}", f"value {i}".encode()).result()
        kv.write("k1", b"again").result()
        print(kv.read("k1").result().value.decode(), sorted(kv.list().result()))
        spec = {
            "driver": "zarr3",
            "kvstore": {"driver": "ocdbt", "base": f"file://{d}/db/"},
            "metadata": {"shape": [64, 32], "data_type": "float32"},
            "create": True,
        }
        a = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
        arr = ts.open(spec).result()
        arr.write(a).result()
        arr[:8].write(np.zeros((8, 32), np.float32)).result()
        back = ts.open({k: v for k, v in spec.items() if k != "create"}).result().read().result()
        a[:8] = 0
        print((back == a).all())
        print(sorted(n for n in os.listdir(f"{d}/db") if n.endswith("__lock")))
        """,
        str(mp),
    )
    assert r.stdout.splitlines() == [
        "again [b'k0', b'k1', b'k2']",
        "True",
        "[]",
    ], r.stderr


def test_a_file_unlinked_while_open_and_open_at_unmount_leaves_no_units(
    ns: Namespace, targets: list[str]
) -> None:
    """The daemon's end with such a file still open (nobody closed it): its new version
    and the version its unlink took the name from are both deleted."""
    fs = CkptFS(ns, JOB_UID, JOB_UID)
    w = StripedWriter(ns, "k.__lock")
    w.write(os.urandom(2 * UNIT + 3))
    w.commit()  # an fsync: published under the name
    h = _Handle(2, "k.__lock", writer=w, openers={1: os.getpid()})
    fs._handles[1] = fs._owner[w] = h
    fs._writing["k.__lock"] = w
    assert fs._unlink_open(h, "k.__lock")
    assert ns.node("k.__lock") is None and _units(targets) != []
    w.write(b"more")
    fs.abort_all()
    assert _units(targets) == []


def test_truncate_by_name_racing_the_last_release_resizes_the_committed_version(
    ns: Namespace,
) -> None:
    """`os.truncate(path, n)` right after the writer's close: its flush committed the
    version, and its release, under load still on its way, has closed the writer but not
    yet forgotten it. The truncate resizes the committed version (it was EIO: the closed
    writer refused it)."""
    fs = CkptFS(ns, JOB_UID, JOB_UID)
    data = os.urandom(2 * UNIT + 5)
    for size, want in ((UNIT + 1, data[: UNIT + 1]), (0, b"")):
        w = StripedWriter(ns, "f")
        w.write(data)
        w.close()  # the release's commit, done; its bookkeeping not yet
        fs._writing["f"] = w
        fs._owner[w] = _Handle(2, "f", writer=w)
        fs._set_size("f", None, size)
        with ns.open("f") as f:
            assert f.read() == want
