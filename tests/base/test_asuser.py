"""A user child outlives no parent (bootseer.asuser): a prolog killed mid-restore (Slurm's
PrologEpilogTimeout sends SIGKILL) used to leave its extracting child running alone,
writing into a temporary directory nobody would rename or remove."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from tests.waiting import wait_until

PARENT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from bootseer.asuser import UserChild

    marks = Path(sys.argv[1])

    def work(_i, _o):
        (marks / "started").write_text("")
        try:
            time.sleep(120)
        finally:
            (marks / "unwound").write_text("")

    child = UserChild.start(int(sys.argv[2]), int(sys.argv[3]), work)
    print(child.pid, flush=True)
    child.result(timeout=300)
    """
)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("as_user", [False, True], ids=["same-uid", "dropped-uid"])
def test_a_child_whose_parent_is_killed_unwinds_and_ends(as_user: bool) -> None:
    if as_user and os.geteuid() != 0:
        pytest.skip("dropping to another uid needs root")
    uid, gid = (65534, 65534) if as_user else (os.getuid(), os.getgid())
    # Where nobody reaches too (pytest's tmp_path lies under root's 0700 directories).
    tmp_path = Path(tempfile.mkdtemp(prefix="bootseer-asuser-", dir="/tmp"))
    tmp_path.chmod(0o777)
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path), str(uid), str(gid)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        wait_until(lambda: (tmp_path / "started").exists(), "the child's work to start")
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        # Unwound (its cleanup ran), not killed outright; and gone.
        wait_until(lambda: (tmp_path / "unwound").exists(), "the orphaned child to unwind")
        wait_until(lambda: not alive(pid), "the orphaned child to end")
    finally:
        parent.kill()
        parent.wait(timeout=30)
        if "pid" in locals() and alive(pid):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(tmp_path, ignore_errors=True)
