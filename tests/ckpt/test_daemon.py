"""The checkpoint mount daemon as a process: how it is started, and known again by its
command line when the epilog stops it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bootseer.ckpt import mount as ckpt_mount
from tests.waiting import wait_until

from .conftest import needs_fuse

MOUNTPOINT = "/run/bootseer/ckpt/4711"


def test_the_daemon_starts_as_a_module_of_its_package() -> None:
    out = subprocess.run(
        [sys.executable, "-m", ckpt_mount.DAEMON_MODULE, "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.startswith("usage: python -m bootseer.ckptd ")
    assert "--identity-fd" in out.stdout and "--totals" in out.stdout
    assert "--namespace" not in out.stdout and "--uid" not in out.stdout


@contextmanager
def process_with_args(*args: str) -> Iterator[int]:
    """A process whose command line is ``python -c ... ARGS`` (as a daemon's would read)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *args])
    try:
        # Read at once, the command line of a process just exec'ed may still be empty.
        cmdline = Path(f"/proc/{proc.pid}/cmdline")
        wait_until(lambda: args[-1].encode() in cmdline.read_bytes(), "its command line")
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("module", ["bootseer.ckptd", "bootseer.ckpt.fuse"])
def test_the_epilog_knows_a_daemon_an_earlier_version_started(module: str) -> None:
    """A job mounted before the node's bootseer was upgraded: its daemon runs the old
    module; the new epilog must still stop it rather than take it for dead."""
    with process_with_args("-m", module, "--namespace", "ada/x", MOUNTPOINT) as pid:
        assert ckpt_mount.daemon_alive(pid, MOUNTPOINT)
        assert not ckpt_mount.daemon_alive(pid, "/run/bootseer/ckpt/4712")
    assert not ckpt_mount.daemon_alive(pid, MOUNTPOINT)


def test_another_process_on_the_mountpoint_is_not_the_daemon() -> None:
    with process_with_args("-m", "bootseer.agent", MOUNTPOINT) as pid:
        assert not ckpt_mount.daemon_alive(pid, MOUNTPOINT)


def test_an_identity_survives_its_descriptor() -> None:
    ident = ckpt_mount.Identity("ada/secret-project/run2", 1001, 1002, 42, ("n1", "n2"))
    fd = ident.to_fd()
    assert ckpt_mount.Identity.from_fd(fd) == ident


@needs_fuse
def test_ps_and_the_mount_table_name_no_namespace(
    mounted: tuple[Path, ckpt_mount.MountRecord],
) -> None:
    """Issue 21 item 6: with ``public_phases = false`` a user must not learn from ``ps``
    or /proc/mounts which namespace (project, run) another user's job works on."""
    mp, rec = mounted
    cmdline = Path(f"/proc/{rec.pid}/cmdline").read_bytes()
    assert b"nobody/test" not in cmdline and b"65534" not in cmdline, cmdline
    assert str(mp).encode() in cmdline  # the epilog still knows its daemon by it
    assert ckpt_mount.daemon_alive(rec.pid, str(mp))
    # Its own line: other sessions on the machine may have mounts of their own.
    mine = [ln for ln in Path("/proc/mounts").read_text().splitlines() if f" {mp} " in ln]
    assert len(mine) == 1 and "nobody/test" not in mine[0], mine
