"""``slurm-dev up --node-fs-gib N``: each node's local directory on a journaled ext4 of its
own, as a node's local disk is (this machine's root file system has no journal, and ext4
without one makes every restore after a delete slow: ``daemons.mount_node_fs``). A real
loop device and a real ext4; no cluster."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from daemons import mount_node_fs


def mounted_at(path: Path) -> int:
    with open("/proc/self/mountinfo") as f:
        return sum(1 for line in f if line.split()[4] == str(path))


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a loop device needs root")
def test_a_nodes_local_directory_gets_a_journaled_file_system_of_its_own(tmp_path: Path) -> None:
    local = tmp_path / "nodes" / "n1" / "local"
    local.mkdir(parents=True)
    image = local.parent / "local.ext4"
    try:
        mount_node_fs(local, 1)
        assert mounted_at(local) == 1
        assert local.stat().st_mode & 0o7777 == 0o1777  # every user's, like a node's /tmp
        head = subprocess.run(
            ["dumpe2fs", "-h", str(image)], capture_output=True, text=True, check=True
        ).stdout
        assert "has_journal" in head
        assert image.stat().st_blocks * 512 < 256 << 20  # sparse: 1 GiB on no more disk
        device = subprocess.run(
            ["findmnt", "-n", "-o", "SOURCE", str(local)], capture_output=True, text=True
        ).stdout.strip()
        dio = Path(f"/sys/block/{Path(device).name}/loop/dio")
        assert dio.read_text().strip() == "1"  # past the host's page cache, as a disk
        (local / "kept").write_text("a node's file")
        mount_node_fs(local, 1)  # mounted already: nothing more
        assert mounted_at(local) == 1
    finally:
        subprocess.run(["umount", str(local)], check=False)
    assert mounted_at(local) == 0 and not (local / "kept").exists()
    try:
        mount_node_fs(local, 1)  # up again after a down: the same file system, kept
        assert (local / "kept").read_text() == "a node's file"
    finally:
        subprocess.run(["umount", str(local)], check=False)
