"""Real savers writing into the real checkpoint mount as the job's user (issue 12):
safetensors, numpy, fio, torch.save and torch.distributed.checkpoint (each also by its
syscalls, which hold where torch is absent)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bootseer.ckpt import Namespace

from .conftest import JOB_UID, OTHER_UID, STAGE_BYTES, UNIT, needs_fuse

pytestmark = needs_fuse
# The venv's interpreter (numpy, safetensors), which every user may run.
PY = sys.executable


def as_user(
    uid: int, *cmd: str, check: bool = True, cwd: str = "/"
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *cmd],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )
    if check:
        assert r.returncode == 0, (cmd, r.stdout, r.stderr)
    return r


def py(uid: int, code: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return as_user(uid, PY, "-c", textwrap.dedent(code), *args, check=check)


def test_safetensors_save_file_and_load_back(
    mounted: tuple[Path, object], job_ns: Namespace
) -> None:
    """ftruncate to the final size, one write from offset 0, rename of the still open
    temporary file (strace of safetensors 0.8): EIO and EBUSY before."""
    pytest.importorskip("safetensors")
    mp, _ = mounted
    py(
        JOB_UID,
        """
        import sys, numpy as np
        from safetensors.numpy import save_file, load_file
        rng = np.random.default_rng(7)
        t = {"w": rng.random((300, 50), dtype=np.float32), "b": np.arange(9, dtype=np.int64)}
        for round in range(3):  # over the previous version, too
            save_file(t, sys.argv[1])
            back = load_file(sys.argv[1])
            assert set(back) == set(t) and all((back[k] == t[k]).all() for k in t), round
        """,
        f"{mp}/model.safetensors",
    )
    assert [e.name for e in job_ns.listdir()] == ["model.safetensors"]  # no temporary left
    with job_ns.open("model.safetensors") as f:
        assert len(f.read()) > 300 * 50 * 4


def test_numpy_save_and_savez(mounted: tuple[Path, object]) -> None:
    """np.savez writes a zip: each member's header is patched after its data, which is
    more than a unit here (a rewrite behind the stream)."""
    mp, _ = mounted
    py(
        JOB_UID,
        f"""
        import sys, numpy as np
        d = sys.argv[1]
        a = np.random.default_rng(1).random(5 * {UNIT} // 8 + 3)
        b = np.arange(3 * {UNIT}, dtype=np.int32)
        np.save(f"{{d}}/a.npy", a)
        assert (np.load(f"{{d}}/a.npy") == a).all()
        np.savez(f"{{d}}/ab.npz", a=a, b=b)
        np.savez_compressed(f"{{d}}/abz.npz", a=a, b=b)
        for name in ("ab.npz", "abz.npz"):
            with np.load(f"{{d}}/{{name}}") as z:
                assert (z["a"] == a).all() and (z["b"] == b).all(), name
        """,
        str(mp),
    )


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio (scripts/bootstrap installs it)")
def test_fio_write_then_verify(mounted: tuple[Path, object], job_ns: Namespace) -> None:
    """fio lays the file out, writes it again through O_RDWR without O_TRUNC, closes,
    and reads it back through O_RDWR to verify each block's checksum."""
    mp, _ = mounted
    r = as_user(
        JOB_UID,
        "fio",
        "--name=wv",
        f"--filename={mp}/fio.dat",
        "--rw=write",
        "--bs=64k",
        "--size=2m",
        "--verify=crc32c",
        "--do_verify=1",
        "--ioengine=psync",
        "--output-format=terse",
        "--verify_state_save=0",
        check=False,
    )
    assert r.returncode == 0, (r.stderr, (mp / ".bootseer.log").read_text()[-2000:])
    assert "verify" not in r.stderr.lower() and "error" not in r.stderr.lower(), r.stderr
    m = job_ns.manifest("fio.dat")
    assert m is not None and m.size == 2 << 20


TORCH_SAVE = """
import os, sys
# torch.save(obj, path) by its syscalls: PyTorchStreamWriter opens the file O_TRUNC and
# writes the zip front to back in its own chunk sizes; 20 saves back to back to one name.
path = sys.argv[1]
for i in range(20):
    blob = bytes([i]) * (3 * {unit} + 123)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for off in range(0, len(blob), 1000):
        os.write(fd, blob[off : off + 1000])
    os.close(fd)
    with open(path, "rb") as f:
        assert f.read() == blob, i
"""


def test_torch_save_write_pattern(mounted: tuple[Path, object]) -> None:
    mp, _ = mounted
    py(JOB_UID, TORCH_SAVE.format(unit=UNIT), f"{mp}/model.pt")


def test_torch_save_itself(mounted: tuple[Path, object]) -> None:
    pytest.importorskip("torch")
    mp, _ = mounted
    py(
        JOB_UID,
        """
        import sys, torch
        t = {"w": torch.randn(300, 300), "step": 7}
        for _ in range(5):
            torch.save(t, sys.argv[1])
        back = torch.load(sys.argv[1])
        assert torch.equal(back["w"], t["w"]) and back["step"] == 7
        """,
        f"{mp}/model.pt",
    )


DCP = """
import os, sys, threading
# torch.distributed.checkpoint's FileSystemWriter by its syscalls: one file per rank
# written by its own thread (sequential writes, flush, fsync, close), then the metadata
# written under a temporary name, fsync'ed, closed and renamed into place.
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
blobs = {{f"__{{r}}_0.distcp": os.urandom(5 * {unit} + r) for r in range(4)}}
def save(name):
    with open(f"{{d}}/{{name}}", "wb") as f:
        for off in range(0, len(blobs[name]), 7777):
            f.write(blobs[name][off : off + 7777])
        f.flush()
        os.fsync(f.fileno())
threads = [threading.Thread(target=save, args=(n,)) for n in blobs]
for t in threads: t.start()
for t in threads: t.join()
with open(f"{{d}}/.metadata.tmp", "wb") as f:
    f.write(b"metadata" * 100)
    os.fsync(f.fileno())
os.rename(f"{{d}}/.metadata.tmp", f"{{d}}/.metadata")
assert sorted(os.listdir(d)) == sorted([".metadata", *blobs])
for name, blob in blobs.items():
    with open(f"{{d}}/{{name}}", "rb") as f:
        assert f.read() == blob, name
"""


def test_torch_distributed_checkpoint_write_pattern(mounted: tuple[Path, object]) -> None:
    mp, _ = mounted
    py(JOB_UID, DCP.format(unit=UNIT), f"{mp}/step100")


def test_torch_distributed_checkpoint_itself(mounted: tuple[Path, object]) -> None:
    """torch.distributed.checkpoint's own save and load (one process, no process group:
    its FileSystemWriter with a thread per file, its metadata renamed into place)."""
    pytest.importorskip("torch")
    mp, _ = mounted
    py(
        JOB_UID,
        """
        import sys, warnings
        import torch
        import torch.distributed.checkpoint as dcp
        warnings.simplefilter("ignore")
        sd = {"w": torch.randn(400, 400), "b": torch.arange(1000.0)}
        dcp.save(sd, checkpoint_id=sys.argv[1])
        back = {"w": torch.empty(400, 400), "b": torch.empty(1000)}
        dcp.load(back, checkpoint_id=sys.argv[1])
        assert torch.equal(back["w"], sd["w"]) and torch.equal(back["b"], sd["b"])
        """,
        f"{mp}/step200",
    )


def test_rename_of_an_open_file(mounted: tuple[Path, object], job_ns: Namespace) -> None:
    mp, _ = mounted
    with job_ns.open("final.bin", "wb") as f:
        f.write(b"old version")
    py(
        JOB_UID,
        """
        import os, sys
        d = sys.argv[1]
        f = open(f"{d}/tmp.bin", "wb")
        f.write(b"a" * 5000)
        os.rename(f"{d}/tmp.bin", f"{d}/final.bin")
        assert not os.path.exists(f"{d}/tmp.bin")
        f.write(b"b" * 5000)
        f.close()
        with open(f"{d}/final.bin", "rb") as g:
            assert g.read() == b"a" * 5000 + b"b" * 5000
        """,
        str(mp),
    )
    assert [e.name for e in job_ns.listdir()] == ["final.bin"]


def test_truncate_then_write_a_gap_and_a_rewrite(
    mounted: tuple[Path, object], job_ns: Namespace
) -> None:
    mp, _ = mounted
    with job_ns.open("f", "wb") as f:
        f.write(os.urandom(4 * UNIT))
    py(
        JOB_UID,
        f"""
        import os, sys
        p = sys.argv[1] + "/f"
        with open(p, "r+b") as f:             # truncate then write (no O_TRUNC at open)
            f.truncate(0)
            f.write(b"new")
        assert open(p, "rb").read() == b"new"
        with open(p, "wb") as f:               # a gap, filled afterwards
            f.seek(3 * {UNIT})
            f.write(b"tail")
            f.seek(0)
            f.write(b"x" * (3 * {UNIT}))
        assert open(p, "rb").read() == b"x" * (3 * {UNIT}) + b"tail"
        with open(p, "wb") as f:               # a rewrite of a range already written
            f.write(b"y" * (5 * {UNIT}))
            f.seek(7)
            f.write(b"HEADER")
        assert open(p, "rb").read() == b"y" * 7 + b"HEADER" + b"y" * (5 * {UNIT} - 13)
        with open(p, "r+b") as f:              # an update in place
            f.seek({UNIT})
            f.write(b"Z")
        assert open(p, "rb").read(2 * {UNIT})[{UNIT} - 1 : {UNIT} + 2] == b"yZy"
        os.truncate(p, 10)                     # truncate -s on a closed file
        assert open(p, "rb").read() == b"y" * 7 + b"HEA"
        """,
        str(mp),
    )


def test_past_the_stage_bound_enospc_and_the_log_says_why(
    mounted: tuple[Path, object], job_ns: Namespace
) -> None:
    mp, _ = mounted
    with job_ns.open("f", "wb") as f:
        f.write(b"previous")
    r = py(
        JOB_UID,
        f"""
        import errno, os, sys
        fd = os.open(sys.argv[1] + "/f", os.O_WRONLY | os.O_TRUNC)
        os.pwrite(fd, b"z" * {STAGE_BYTES // 2}, {UNIT})      # a gap: staged
        try:
            os.pwrite(fd, b"z" * {STAGE_BYTES}, {STAGE_BYTES})
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
            print("ENOSPC")
        try:
            os.close(fd)
        except OSError as exc:
            print("close:", exc.errno == errno.ENOSPC)
        """,
        str(mp),
    )
    assert r.stdout.split("\n")[:2] == ["ENOSPC", "close: True"], r.stdout
    with job_ns.open("f") as f:
        assert f.read() == b"previous"  # nothing half-written published
    text = as_user(JOB_UID, "cat", f"{mp}/.bootseer.log").stdout
    assert "stage_bytes" in text and "f: new version dropped" in text, text
    # Only the job's user reads it; nobody may change it; it is not a file of the namespace.
    assert as_user(OTHER_UID, "cat", f"{mp}/.bootseer.log", check=False).returncode != 0
    assert as_user(JOB_UID, "rm", "-f", f"{mp}/.bootseer.log", check=False).returncode != 0
    assert ".bootseer.log" not in as_user(JOB_UID, "ls", "-a", str(mp)).stdout
    assert [e.name for e in job_ns.listdir()] == ["f"]


def test_hard_links_are_refused_with_eperm(mounted: tuple[Path, object]) -> None:
    """Symlinks are made (tests/ckpt/test_posix.py); hard links are not."""
    mp, _ = mounted
    as_user(JOB_UID, "sh", "-c", f"echo x > {mp}/a")
    r = as_user(JOB_UID, "ln", f"{mp}/a", f"{mp}/c", check=False)
    assert r.returncode != 0 and "Operation not permitted" in r.stderr
    assert "hard link 'c' refused" in as_user(JOB_UID, "cat", f"{mp}/.bootseer.log").stdout


def test_shared_mmap_for_writing_is_refused_with_enodev(
    mounted: tuple[Path, object], job_ns: Namespace
) -> None:
    """np.memmap(mode="w+"/"r+") maps the file MAP_SHARED for writing: refused by the
    kernel with ENODEV (a handle open for writing is direct I/O), so a mapping's pages
    never reach the mount after the close that published the file (numpy closes its
    descriptor right after mmap). Read-only and copy-on-write mappings work."""
    mp, _ = mounted
    with job_ns.open("kept.bin", "wb") as f:
        f.write(bytes(range(256)) * (3 * UNIT // 256))
    r = py(
        JOB_UID,
        f"""
        import errno, sys, numpy as np
        d = sys.argv[1]
        for mode, name in (("w+", "new.bin"), ("r+", "kept.bin")):
            try:
                m = np.memmap(f"{{d}}/{{name}}", dtype=np.uint8, mode=mode, shape=(3 * {UNIT},))
                m[:] = 7
                m.flush()
                print(mode, "mapped")
            except OSError as exc:
                print(mode, errno.errorcode[exc.errno])
        m = np.memmap(f"{{d}}/kept.bin", dtype=np.uint8, mode="r")
        assert m[:256].tolist() == list(range(256)) and len(m) == 3 * {UNIT}
        c = np.memmap(f"{{d}}/kept.bin", dtype=np.uint8, mode="c")
        c[:] = 9  # private: never written back
        print("read-only and copy-on-write map")
        """,
        str(mp),
    )
    assert r.stdout.split("\n")[:3] == [
        "w+ ENODEV",
        "r+ ENODEV",
        "read-only and copy-on-write map",
    ], r.stdout
    with job_ns.open("kept.bin") as f:
        assert f.read() == bytes(range(256)) * (3 * UNIT // 256)  # r+: untouched
