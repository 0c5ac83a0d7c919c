"""The checkpoint write benchmark's smoke size (slurm-dev/bench/ckpt/write_bench.py): it
must run through, every saver must work on this tree and read back byte for byte. No
speed is asserted here: figures come from the benchmark's own runs."""

from __future__ import annotations

from pathlib import Path

from tests.benchrun import run_bench

from .conftest import needs_fuse

pytestmark = needs_fuse


def test_write_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "results"
    run_bench(
        "ckpt/write_bench.py",
        "--smoke",
        "--state-dir",
        str(tmp_path / "state"),
        "--out",
        str(out),
        timeout=900,
    )
    text = out.with_suffix(".txt").read_text()
    for saver in ("seq", "np.save", "safetensors"):
        assert saver in text
    assert not (tmp_path / "state").exists()  # cleaned up
