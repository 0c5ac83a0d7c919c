"""Path images are read through the one descriptor the job's user opened (issue 11).

The agent runs as root; the image file and the directories above it belong to users.
Whatever a user does to the path after the prolog's prepare (swap the file for a FIFO,
a directory for a link to one she cannot enter), the agent keeps reading the file it
opened as her, and after a restart serves the job only if the path still names that
very file. No Slurm needed: a real agent, real FUSE, real squashfs images.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import pytest

from bootseer.agentapi.jobs import Status
from tests.imagekit import add_image, make_squashfs, running_agent

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("mksquashfs") or not os.path.exists("/dev/fuse"),
        reason="needs root, /dev/fuse and squashfs-tools",
    ),
]

FILES = {"bin/tool": 300_000, "lib/big.so": 900_000}
ALICE, BOB = 4242, 4343


def users_image(base: Path, name: str, seed: int = 1) -> Path:
    """``<base>/<name>/img.sqsh``, the directory and the file alice's own."""
    home = base / name
    home.mkdir()
    image = make_squashfs(home / "img.sqsh", FILES, seed=seed)
    for p in (home, image):
        os.chown(p, ALICE, ALICE)
    image.chmod(0o644)
    return image


def unblock(fifo: Path) -> None:
    """Release any thread of an agent stuck opening ``fifo`` (today's bug), so it can stop."""
    for _ in range(64):
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_image_swapped_for_a_fifo_blocks_no_fetch_thread(base: Path) -> None:
    image = users_image(base, "alice")
    original = image.read_bytes()
    other = make_squashfs(base / "other.sqsh", {"x": 400_000}, seed=7)
    add_image(base, other, "other:1")
    with running_agent(base, prefetch_parallel=2, fetch_timeout=3.0) as agent:
        lazy = Path(agent.prepare(1, str(image), uid=ALICE, gid=ALICE)["path"])
        image.rename(image.with_name("img.orig"))
        os.mkfifo(image)  # alice's directory, alice's swap
        try:
            # The agent reads the file it opened at prepare: the FIFO is never opened.
            assert lazy.read_bytes() == original
            # Every fetch thread is free: bob's job on the same node gets his image.
            theirs = Path(agent.prepare(2, "other:1", uid=BOB, gid=BOB)["path"])
            assert theirs.read_bytes() == other.read_bytes()
            # A new job on the swapped path is refused at once, not held by the FIFO.
            with pytest.raises(Exception, match="not a regular file"):
                agent.prepare(3, str(image), uid=ALICE, gid=ALICE)
        finally:
            unblock(image)
        agent.release(1)
        agent.release(2)


def test_directory_swapped_for_a_link_is_not_read_through(base: Path) -> None:
    """After prepare, alice swaps her directory for a link to one only root may enter,
    holding the same image: the agent must not read it. She then scribbles over her own
    file: the agent, reading what it opened, gets her bytes, refuses them (digest) and
    the job sees EIO; it never falls through the link to root's copy."""
    image = users_image(base, "alice")
    private = base / "private"
    private.mkdir(mode=0o700)
    shutil.copy2(image, private / "img.sqsh")
    os.chown(private / "img.sqsh", 0, 0)
    with running_agent(base, fetch_timeout=3.0) as agent:
        lazy = Path(agent.prepare(1, str(image), uid=ALICE, gid=ALICE)["path"])
        moved = base / "alice.old"
        (base / "alice").rename(moved)
        (base / "alice").symlink_to(private)
        with open(moved / "img.sqsh", "r+b") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(65536)
            f.write(b"\0" * (size - 65536))
        fd = os.open(lazy, os.O_RDONLY)
        try:
            with pytest.raises(OSError):
                os.pread(fd, 4096, 5 * 65536)
        finally:
            os.close(fd)
        assert "digest mismatch" in agent.log_text()
        # A new prepare through the link is the kernel's to refuse, as alice.
        with pytest.raises(Exception, match="not readable by uid"):
            agent.prepare(2, str(image), uid=ALICE, gid=ALICE)
        agent.release(1)


def test_restart_serves_a_path_image_only_if_it_is_the_same_file(base: Path) -> None:
    kept = users_image(base, "kept", seed=1)
    fifo = users_image(base, "fifo", seed=2)
    copied = users_image(base, "copied", seed=3)
    with running_agent(base) as agent:
        for job, image in ((1, kept), (2, fifo), (3, copied)):
            agent.prepare(job, str(image), uid=ALICE, gid=ALICE)
        agent.stop()
        fifo.rename(fifo.with_name("img.orig"))
        os.mkfifo(fifo)
        shutil.copy2(copied, copied.with_name("img.copy"))  # same bytes, same mtime
        copied.with_name("img.copy").rename(copied)  # another inode
        os.chown(copied, ALICE, ALICE)
        try:
            agent.start()  # must not hang on the FIFO
            assert agent.stats()["jobs"] == [1]
            log = agent.log_text()
            assert "state 2.json not restored" in log and "not a regular file" in log
            assert "state 3.json not restored" in log
            lazy = Path(agent.client.ask(Status(1)).path)
            assert lazy.read_bytes() == kept.read_bytes()
        finally:
            unblock(fifo)
        agent.release(1)
