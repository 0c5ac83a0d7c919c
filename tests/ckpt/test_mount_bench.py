"""The mount-against-local-disk benchmark's smoke size (slurm-dev/bench/ckpt/mount_bench.py):
it must run through on this tree, report every workload against the local disk with the
daemon's CPU per GiB, and leave nothing behind. No speed is asserted here."""

from __future__ import annotations

import json
from pathlib import Path

from tests.benchrun import run_bench

from .conftest import needs_fuse

pytestmark = needs_fuse


def test_mount_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "results"
    run_bench(
        "ckpt/mount_bench.py",
        "--smoke",
        "--state-dir",
        str(tmp_path / "state"),
        "--out",
        str(out),
        timeout=900,
    )
    res = json.loads(out.with_suffix(".json").read_text())
    for w in ("write_seq", "read_seq", "read_part"):
        assert res["mb_s_median"]["local"][w] > 0 and res["mb_s_median"]["mount"][w] > 0
        assert res["daemon_cpu_s_per_gib_median"]["mount"][w] >= 0
    assert not (tmp_path / "state").exists()  # cleaned up
