"""The checkpoint mount daemons' metrics: one file per node that every daemon adds its
increments to (bootseer.ckptd.metrics), read by Debian's node_exporter."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bootseer import filelock
from bootseer.ckpt import Namespace
from bootseer.ckpt import mount as ckpt_mount
from bootseer.ckpt.stage import Stage
from bootseer.ckptd.fs import CkptFS
from bootseer.ckptd.metrics import FILE, LOCK, CkptMetrics
from tests.conftest import TEST_PORT_BASE
from tests.exporterkit import EXPORTER, node_exporter, scrape

from .conftest import JOB_UID, needs_fuse
from .test_mount import as_user

PORT = TEST_PORT_BASE + 91  # inside this checkout's reserved range, on loopback


def samples(directory: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = (directory / FILE).read_text()
    return {
        (x.name, tuple(sorted(x.labels.items()))): x.value
        for fam in text_string_to_metric_families(text)
        for x in fam.samples
    }


def test_daemons_add_their_increments_to_one_file(
    tmp_path: Path, ns: Namespace, targets: list[str]
) -> None:
    """Two daemons of one node, each flushing now and then: the file holds the sums,
    nothing counted twice; a write that could not take the lock is carried over."""
    d = tmp_path / "textfile"
    a = CkptFS(ns, 1000, 1000, Stage(tmp_path / "stage-a", 1 << 20))
    b = CkptFS(Namespace(ns.targets, "bob/run", unit_size=4096), 1001, 1001)
    ma, mb = CkptMetrics(d, 60, a.counts, print), CkptMetrics(d, 60, b.counts, print)
    a.bytes_written, b.bytes_written = 100, 7
    assert ma.flush() and mb.flush()
    a.bytes_written += 50
    a.refused["append"] += 1
    with filelock.held(d / LOCK, 5):  # another daemon is writing: given up for now
        assert not ma.flush(wait=0.05)
    assert samples(d)[("bootseer_ckpt_written_bytes_total", ())] == 107
    a.bytes_read = 9
    ma.stop()
    mb.stop()
    got = samples(d)
    assert got[("bootseer_ckpt_written_bytes_total", ())] == 157
    assert got[("bootseer_ckpt_read_bytes_total", ())] == 9
    assert got[("bootseer_ckpt_mounts_total", ())] == 2
    assert got[("bootseer_ckpt_refused_calls_total", (("reason", "append"),))] == 1
    assert got[("bootseer_ckpt_refused_calls_total", (("reason", "quota"),))] == 0
    assert (d / FILE).stat().st_mode & 0o777 == 0o644


@pytest.fixture
def textfiles(site_config: Path) -> Iterator[Path]:
    """[metrics] for the mount daemon: a directory node_exporter (nobody) may read."""
    d = Path(tempfile.mkdtemp(prefix="bootseer-textfile-", dir="/tmp"))
    d.chmod(0o755)
    with site_config.open("a") as f:
        f.write(f'[metrics]\ntextfile_dir = "{d}"\ninterval = 1\n')
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@needs_fuse
@pytest.mark.skipif(EXPORTER is None, reason="needs prometheus-node-exporter")
def test_a_mount_daemon_counts_what_it_moved_and_node_exporter_reads_it(
    textfiles: Path, mounted: tuple[Path, ckpt_mount.MountRecord], tmp_path: Path
) -> None:
    mp, rec = mounted
    code = (
        "import os, sys, pathlib\n"
        "mp = pathlib.Path(sys.argv[1])\n"
        "(mp / 'm.pt').write_bytes(b'm' * 5000)\n"
        "assert (mp / 'm.pt').read_bytes() == b'm' * 5000\n"
        "try:\n"
        "    os.symlink('/etc/passwd', mp / 'link')  # absolute: EPERM\n"
        "except PermissionError:\n"
        "    pass\n"
        "else:\n"
        "    sys.exit('a link was made')\n"
    )
    as_user(JOB_UID, sys.executable, "-c", code, str(mp))
    res = ckpt_mount.stop(rec)
    assert not res.died
    got = samples(textfiles)
    assert got[("bootseer_ckpt_written_bytes_total", ())] == 5000
    assert got[("bootseer_ckpt_read_bytes_total", ())] >= 5000  # the kernel may ask again
    assert got[("bootseer_ckpt_versions_total", (("result", "committed"),))] == 1
    assert got[("bootseer_ckpt_unit_bytes_total", (("source", "store"),))] >= 5000
    assert got[("bootseer_ckpt_refused_calls_total", (("reason", "not_permitted"),))] == 1
    assert got[("bootseer_ckpt_verification_failures_total", ())] == 0

    with node_exporter(textfiles, PORT, tmp_path / "exporter.err"):
        served = scrape(PORT)
    assert served[("node_textfile_scrape_error", ())] == 0, (tmp_path / "exporter.err").read_text()
    assert served[("bootseer_ckpt_written_bytes_total", ())] == 5000
    assert os.stat(textfiles / FILE).st_uid == 0


def test_admin_doc_lists_every_ckpt_series() -> None:
    from bootseer.ckptd.metrics import FAMILIES

    doc = (Path(__file__).resolve().parents[2] / "docs" / "admin.md").read_text()
    for f in FAMILIES:
        name = f"{f.name}_total" if f.kind == "counter" else f.name
        assert f"| `{name}` | {f.kind} |" in doc, name
