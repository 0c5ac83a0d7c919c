"""The agent's block cache shares its disk with what users can fill (by default the
checkpoint stage, ``<paths.cache_dir>/ckpt-stage``, where a job's out-of-order writes
wait): a full disk must cost the cache, never another user's reads."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.imagekit import add_image, make_squashfs, running_agent

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("mksquashfs") or not os.path.exists("/dev/fuse"),
        reason="needs root, /dev/fuse and squashfs-tools",
    ),
]

FILES = {"bin/tool": 300_000, "lib/big.so": 1_500_000, "etc/conf": 5000}


@pytest.fixture
def small_cache_disk(base: Path) -> Iterator[Path]:
    """``<base>/t1/cache`` (the node's cache_dir) on a 4 MiB tmpfs of its own, unmounted at
    the end whatever happened."""
    disk = base / "t1" / "cache"
    disk.mkdir(parents=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", str(disk)], check=True
    )
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def test_a_full_cache_disk_costs_the_cache_not_the_reads(
    base: Path, small_cache_disk: Path
) -> None:
    """Staged bytes fill the disk the block cache is on (here a file in the stage's
    directory stands for them: the stage's own files are unlinked). Before, every block
    the agent fetched failed to be cached (ENOSPC), the failure counted as a failed
    fetch, and every image job on the node read EIO until the disk had room; now each
    verified block is served uncached and the agent says so once."""
    image = make_squashfs(base / "img.sqsh", FILES)
    add_image(base, image, "test:1")
    with running_agent(base, hot_start_fraction=0.0, fetch_timeout=3.0) as agent:
        lazy = Path(agent.prepare(1, "test:1")["path"])
        stage = small_cache_disk / "ckpt-stage"
        stage.mkdir(exist_ok=True, mode=0o700)
        fd = os.open(stage / "staged", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            with pytest.raises(OSError) as full:
                while True:
                    os.write(fd, b"\0" * (1 << 16))
            assert full.value.errno == errno.ENOSPC
        finally:
            os.close(fd)
        assert lazy.read_bytes() == image.read_bytes()
        assert "served uncached" in agent.log_text()
        agent.release(1)
