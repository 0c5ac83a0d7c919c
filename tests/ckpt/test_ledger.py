"""[ckpt] stage_bytes bounds a node's staging, all its checkpoint mounts together (issue 12):
the ledger's records, a dead daemon's share freed, and two real mounts of one node."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer.ckpt import Namespace
from bootseer.ckpt import mount as ckpt_mount
from bootseer.ckpt.errors import LedgerFull, StageFullError
from bootseer.ckpt.ledger import StageLedger
from bootseer.ckpt.stage import Stage

from .conftest import JOB_UID, STAGE_BYTES, UNIT, needs_fuse
from .test_clients import as_user, py


def test_reservations_add_up_across_daemons(tmp_path: Path) -> None:
    a, b = StageLedger(tmp_path, 100), StageLedger(tmp_path, 100)
    try:
        a.reserve(60, "a")
        with pytest.raises(LedgerFull) as exc:
            b.reserve(41, "b")
        assert (exc.value.used, b.used) == (60, 0)
        b.reserve(40, "b")
        assert a.node_used() == b.node_used() == 100
        a.release(60)
        b.reserve(60, "b")
        assert (a.used, b.used) == (0, 100)
    finally:
        a.close()
        b.close()
    assert [p.name for p in tmp_path.iterdir()] == [".lock"]  # records removed at close


def test_a_dead_daemons_share_is_freed(tmp_path: Path) -> None:
    """A daemon killed with its bytes staged (its staged files died with it) holds
    nothing: its record is dropped at the next reservation."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import sys
                from pathlib import Path
                from bootseer.ckpt.ledger import StageLedger
                led = StageLedger(Path(sys.argv[1]), 100)
                led.reserve(90, "x")
                print("reserved", flush=True)
                sys.stdin.read()
                """
            ),
            str(tmp_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "reserved\n"
        mine = StageLedger(tmp_path, 100)
        with pytest.raises(LedgerFull):
            mine.reserve(20, "y")  # the child lives: its 90 count
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        mine.reserve(100, "y")
        assert len(list(tmp_path.glob("*.staged"))) == 1  # the dead one's record is gone
        mine.close()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_stage_bound_is_the_nodes_not_each_daemons(tmp_path: Path) -> None:
    one, two = Stage.root_only(tmp_path / "st", 10), Stage.root_only(tmp_path / "st", 10)
    f, g = one.file("a"), two.file("b")
    try:
        f.put(0, b"x" * 8)
        with pytest.raises(StageFullError, match="8 of \\[ckpt\\] stage_bytes = 10"):
            g.put(0, b"y" * 3)
        f.drop(0, 8)
        g.put(0, b"y" * 3)
    finally:
        f.close()
        g.close()
        one.close()
        two.close()


@pytest.fixture
def second_mount(
    site_config: Path, mount_root: Path, tmp_path: Path
) -> Iterator[tuple[Path, ckpt_mount.MountRecord]]:
    """Another job's mount on the same node: its own daemon, the same stage directory."""
    mp = ckpt_mount.prepare_mountpoint(mount_root, "43", JOB_UID, JOB_UID)
    state = tmp_path / "state2"
    state.mkdir()
    rec = ckpt_mount.start(mp, "nobody/other", JOB_UID, JOB_UID, state, node="", timeout=20)
    try:
        yield mp, rec
    finally:
        ckpt_mount.stop(rec)


@needs_fuse
def test_two_mounts_of_a_node_share_the_bound(
    mounted: tuple[Path, object],
    second_mount: tuple[Path, object],
    job_ns: Namespace,
) -> None:
    """Two jobs' daemons staging at once get stage_bytes between them, not each: the
    second's write out of order fails with ENOSPC while the first holds 3/4 of it, and
    goes through once the first closed its file."""
    mp1, _ = mounted
    mp2, _ = second_mount
    r = py(
        JOB_UID,
        f"""
        import errno, os, sys
        a = os.open(sys.argv[1] + "/a", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.pwrite(a, b"a" * {3 * STAGE_BYTES // 4}, {UNIT})          # a gap: staged
        b = os.open(sys.argv[2] + "/b", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            os.pwrite(b, b"b" * {STAGE_BYTES // 2}, {UNIT})
            print("staged past the node's bound")
        except OSError as exc:
            print(errno.errorcode[exc.errno])
        try:
            os.close(b)                                            # its version dropped
        except OSError as exc:
            print("close", errno.errorcode[exc.errno])
        os.pwrite(a, b"a" * {UNIT}, 0)                             # the stream takes it
        os.close(a)
        b = os.open(sys.argv[2] + "/b", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.pwrite(b, b"b" * {STAGE_BYTES // 2}, {UNIT})
        os.pwrite(b, b"b" * {UNIT}, 0)
        os.close(b)
        print("ok")
        """,
        str(mp1),
        str(mp2),
    )
    assert r.stdout.split("\n")[:3] == ["ENOSPC", "close ENOSPC", "ok"], r.stdout
    with job_ns.open("a") as f:
        assert f.read() == b"a" * (UNIT + 3 * STAGE_BYTES // 4)
    log = as_user(JOB_UID, "cat", f"{mp2}/.bootseer.log").stdout
    assert "on this node" in log, log
