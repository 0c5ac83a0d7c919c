"""Installing the SPANK plugin again while a job runs: slurmstepd and srun have it mapped,
so it is replaced by a rename, never rewritten in place (the loaded copies crashed)."""

from __future__ import annotations

import mmap
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import TOP, devcluster


def mapped(path: Path) -> tuple[mmap.mmap, bytes]:
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    return m, m[:]


@pytest.mark.root
def test_slurm_dev_replaces_the_plugin_by_a_rename(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("writing a slurm-dev config needs root")
    if not (TOP / "spank" / "bootseer.so").exists():
        pytest.skip("spank/bootseer.so is not built (scripts/bootstrap)")
    cluster = devcluster.Cluster(devcluster.Settings(str(tmp_path / "dev"), nodes=1))
    cluster.write_config()
    so = cluster.dir / "lib" / "bootseer.so"
    so.write_bytes(b"\x7fELF an older build " * 4096)  # what a running job has loaded
    loaded, before = mapped(so)
    inode = so.stat().st_ino
    cluster.write_config()  # `slurm-dev/up` again
    assert loaded[:] == before  # the mapped copy is untouched
    assert so.read_bytes() == (TOP / "spank" / "bootseer.so").read_bytes()
    assert so.stat().st_ino != inode
    assert not [p for p in so.parent.iterdir() if p.name.endswith(".tmp")]
    loaded.close()


def test_make_install_replaces_the_plugin_by_a_rename(tmp_path: Path) -> None:
    if not shutil.which("make") or not (TOP / "spank" / "bootseer.so").exists():
        pytest.skip("needs make and a built spank/bootseer.so")
    libdir = tmp_path / "lib" / "slurm"
    libdir.mkdir(parents=True)
    so = libdir / "bootseer.so"
    so.write_bytes(b"\x7fELF an older build " * 4096)
    loaded, before = mapped(so)
    r = subprocess.run(
        ["make", "-s", "-C", str(TOP / "spank"), "install", f"LIBDIR={libdir}"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert loaded[:] == before
    assert so.read_bytes() == (TOP / "spank" / "bootseer.so").read_bytes()
    assert os.access(so, os.X_OK)
    assert sorted(p.name for p in libdir.iterdir()) == ["bootseer.so"]
    loaded.close()
