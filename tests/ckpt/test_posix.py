"""What frameworks do beside whole files, through the real mount as the job's user
(issue 23): renaming a directory (one atomic commit), relative symlinks, appends and
in-place updates."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer.ckpt import Namespace
from bootseer.ckpt import mount as ckpt_mount
from tests.waiting import wait_until

from .conftest import JOB_UID, UNIT, needs_fuse
from .test_clients import PY, as_user, py

pytestmark = needs_fuse


def test_relative_symlink_readlink_and_open_through_it(
    mounted: tuple[Path, object], job_ns: Namespace
) -> None:
    mp, _ = mounted
    data = os.urandom(2 * UNIT + 1)
    with job_ns.open("checkpoint-2/model.pt", "wb") as f:
        f.write(data)
    r = py(
        JOB_UID,
        """
        import os, sys
        d = sys.argv[1]
        os.symlink("checkpoint-2", f"{d}/latest")
        os.symlink("../checkpoint-2/model.pt", f"{d}/checkpoint-2/again.pt")
        print(os.readlink(f"{d}/latest"), os.path.islink(f"{d}/latest"))
        print(sorted(os.listdir(d)))
        with open(f"{d}/latest/model.pt", "rb") as f:
            sys.stdout.write(f.read().hex() + "\\n")
        with open(f"{d}/checkpoint-2/again.pt", "rb") as f:
            sys.stdout.write(f.read().hex() + "\\n")
        os.replace(f"{d}/latest", f"{d}/newest")  # a link renames like a file
        os.unlink(f"{d}/newest")
        print(os.path.lexists(f"{d}/newest"))
        """,
        str(mp),
    )
    lines = r.stdout.splitlines()
    assert lines[0] == "checkpoint-2 True"
    assert lines[1] == "['checkpoint-2', 'latest']"
    assert lines[2] == lines[3] == data.hex()
    assert lines[4] == "False"
    # Other nodes see what the namespace holds: the API reads the same link.
    assert job_ns.node("checkpoint-2/again.pt") is not None


def test_absolute_and_escaping_symlinks_are_refused(
    mounted: tuple[Path, object], job_ns: Namespace
) -> None:
    mp, _ = mounted
    r = py(
        JOB_UID,
        """
        import errno, os, sys
        d = sys.argv[1]
        os.mkdir(f"{d}/a")
        for target, name in (("/etc/passwd", "abs"), ("../../x", "a/esc"), ("..", "up")):
            try:
                os.symlink(target, f"{d}/{name}")
                print(name, "made")
            except OSError as exc:
                print(name, errno.errorcode[exc.errno])
        """,
        str(mp),
    )
    assert r.stdout.split("\n")[:3] == ["abs EPERM", "a/esc EXDEV", "up EXDEV"]
    log = as_user(JOB_UID, "cat", f"{mp}/.bootseer.log").stdout
    assert "an absolute target" in log and "leaves the checkpoint namespace" in log
    assert [e.name for e in job_ns.listdir()] == ["a"]


def test_append_and_update_in_place(mounted: tuple[Path, object], job_ns: Namespace) -> None:
    mp, _ = mounted
    base = os.urandom(3 * UNIT + 5)
    with job_ns.open("metrics.jsonl", "wb") as f:
        f.write(base)
    py(
        JOB_UID,
        """
        import sys
        d = sys.argv[1]
        with open(f"{d}/metrics.jsonl", "ab") as f:
            f.write(b'{"step": 1}\\n')
        with open(f"{d}/metrics.jsonl", "a") as f:
            f.write('{"step": 2}\\n')
        with open(f"{d}/metrics.jsonl", "r+b") as f:
            f.seek(UNIT + 1)
            f.write(b"PATCH")
        with open(f"{d}/new.log", "a") as f:  # append creates
            f.write("one\\n")
        with open(f"{d}/new.log", "a") as f:
            f.write("two\\n")
        """.replace("UNIT", str(UNIT)),
        str(mp),
    )
    want = bytearray(base + b'{"step": 1}\n{"step": 2}\n')
    want[UNIT + 1 : UNIT + 6] = b"PATCH"
    with job_ns.open("metrics.jsonl") as f:
        assert f.read() == bytes(want)
    with job_ns.open("new.log") as f:
        assert f.read() == b"one\ntwo\n"
    r = as_user(JOB_UID, "sh", "-c", f"echo more >> {mp}/new.log && cat {mp}/new.log")
    assert r.stdout == "one\ntwo\nmore\n"


@pytest.fixture
def other_node(
    mounted: tuple[Path, ckpt_mount.MountRecord], mount_root: Path, tmp_path: Path
) -> Iterator[Path]:
    """A second daemon mounting the same namespace: what another node of the job sees."""
    mp = ckpt_mount.prepare_mountpoint(mount_root, "43", JOB_UID, JOB_UID)
    state = tmp_path / "state-other"
    state.mkdir()
    rec = ckpt_mount.start(mp, "nobody/test", JOB_UID, JOB_UID, state, node="", timeout=60)
    try:
        yield mp
    finally:
        ckpt_mount.stop(rec)


SAVE_AND_RENAME = """
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
os.mkdir(f"{d}/tmp-ckpt-2")
for i in range(n):
    with open(f"{d}/tmp-ckpt-2/shard-{i}.pt", "wb") as f:
        f.write(b"new %d" % i)
old = open(f"{d}/checkpoint-1/model.pt", "rb")  # open before the old tree goes
print("written", flush=True)
sys.stdin.readline()
os.replace(f"{d}/checkpoint-1", f"{d}/old-1")
os.replace(f"{d}/tmp-ckpt-2", f"{d}/checkpoint-2")
print("renamed", old.read().decode(), flush=True)
"""


def _observe(mp: Path, n: int) -> str:
    """What another node sees of the save: "old", "new", or an AssertionError naming a
    tree that is neither."""
    try:
        names = sorted(os.listdir(mp))
        ckpt = sorted(os.listdir(mp / "checkpoint-2")) if "checkpoint-2" in names else []
        tmp = sorted(os.listdir(mp / "tmp-ckpt-2")) if "tmp-ckpt-2" in names else []
    except FileNotFoundError:  # listed, then renamed before the next look: look again
        return "moving"
    want = sorted(f"shard-{i}.pt" for i in range(n))
    if "checkpoint-2" in names:
        assert "tmp-ckpt-2" not in names and ckpt == want, (names, ckpt)
        return "new"
    assert tmp == want, (names, tmp)
    return "old"


def test_rename_of_a_directory_is_one_atomic_change(
    mounted: tuple[Path, object], other_node: Path, job_ns: Namespace
) -> None:
    """os.replace of a directory: one commit, whatever it holds; the other node sees the
    old tree or the new one, never a mix; a file opened before reads on."""
    mp, _ = mounted
    n = 40
    job_ns.tree_ttl = 0  # another reader: it looks at the rename table every time
    with job_ns.open("checkpoint-1/model.pt", "wb") as f:
        f.write(b"step 1")
    proc = subprocess.Popen(
        [
            *("setpriv", f"--reuid={JOB_UID}", f"--regid={JOB_UID}", "--clear-groups"),
            *(PY, "-c", SAVE_AND_RENAME, str(mp), str(n)),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline() == "written\n"
        assert _observe(other_node, n) == "old"
        proc.stdin.write("go\n")
        proc.stdin.flush()
        seen = wait_until(
            lambda: _observe(other_node, n) == "new" and "new", "the other node sees the rename"
        )
        assert seen == "new"
        assert proc.stdout.readline() == "renamed step 1\n"
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
        proc.wait()
    assert sorted(e.name for e in job_ns.listdir()) == ["checkpoint-2", "old-1"]
    with job_ns.open("checkpoint-2/shard-7.pt") as f:
        assert f.read() == b"new 7"
    with open(other_node / "old-1" / "model.pt", "rb") as f:
        assert f.read() == b"step 1"
    log = as_user(JOB_UID, "cat", f"{mp}/.bootseer.log").stdout
    assert "directory tmp-ckpt-2 renamed to checkpoint-2" in log


def test_directory_names_renamed_away_made_again_replaced_and_removed(
    mounted: tuple[Path, object], job_ns: Namespace
) -> None:
    """The save loop of a framework: a temporary name used again and again, renamed onto
    an empty directory, old checkpoints removed (shutil.rmtree); a non-empty target is
    ENOTEMPTY, a file ENOTDIR."""
    mp, _ = mounted
    r = py(
        JOB_UID,
        """
        import errno, os, shutil, sys
        d = sys.argv[1]
        for step in (1, 2, 3):
            os.makedirs(f"{d}/run/tmp/sub")
            with open(f"{d}/run/tmp/sub/w.pt", "w") as f:
                f.write(f"step {step}")
            os.mkdir(f"{d}/run/ckpt-{step}")  # an empty target is replaced
            os.rename(f"{d}/run/tmp", f"{d}/run/ckpt-{step}")
        print(sorted(os.listdir(f"{d}/run")))
        print([open(f"{d}/run/ckpt-{s}/sub/w.pt").read() for s in (1, 2, 3)])
        shutil.rmtree(f"{d}/run/ckpt-1")
        os.rename(f"{d}/run/ckpt-2", f"{d}/moved")  # to another directory
        os.rename(f"{d}/moved", f"{d}/run/ckpt-2")  # and back
        os.mkdir(f"{d}/run/tmp")
        print(sorted(os.listdir(f"{d}/run")), os.listdir(f"{d}/run/tmp"))
        open(f"{d}/file", "w").close()
        for target in ("run/ckpt-3", "file"):
            try:
                os.rename(f"{d}/run/ckpt-2", f"{d}/{target}")
            except OSError as exc:
                print(errno.errorcode[exc.errno])
        """,
        str(mp),
    )
    lines = r.stdout.splitlines()
    assert lines[0] == "['ckpt-1', 'ckpt-2', 'ckpt-3']"
    assert lines[1] == "['step 1', 'step 2', 'step 3']"
    assert lines[2] == "['ckpt-2', 'ckpt-3', 'tmp'] []"
    assert lines[3:] == ["ENOTEMPTY", "ENOTDIR"]
    assert sorted(job_ns.walk()) == ["file", "run/ckpt-2/sub/w.pt", "run/ckpt-3/sub/w.pt"]
