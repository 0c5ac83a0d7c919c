"""The FUSE passthrough probe (slurm-dev/bench/ckpt/passthrough.py) at a small size: every
variant reads the whole file; through passthrough the kernel reads the backing file
itself (no read request reaches the daemon), through the served mounts every byte is a
request; a file opened one way opens the other way once that open is closed; nothing
is left mounted or on disk. No speed is asserted here."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.benchrun import run_bench

from .conftest import needs_fuse

pytestmark = [
    needs_fuse,
    pytest.mark.skipif(
        tuple(int(x) for x in os.uname().release.split(".")[:2]) < (6, 9),
        reason="FUSE passthrough needs Linux 6.9 or later",
    ),
]


def test_passthrough_probe_smoke(tmp_path: Path) -> None:
    out = tmp_path / "results"
    state = tmp_path / "state"
    run_bench(
        "ckpt/passthrough.py",
        "--size-mib", "16", "--reps", "2",
        "--state-dir", str(state), "--out", str(out),
        timeout=600,
    )  # fmt: skip
    res = json.loads(out.with_suffix(".json").read_text())
    for how in ("seq", "mmap"):
        by = res["median"][how]
        assert set(by) == {"local", "pyfuse3", "served", "passthrough"}
        for v, m in by.items():
            assert m["mib_s"] > 0 and m["reader_cpu_s_per_gib"] >= 0, (how, v, m)
        assert by["passthrough"]["read_requests"] == 0  # the kernel read the backing file
        assert by["served"]["read_requests"] > 0 and by["pyfuse3"]["read_requests"] > 0
        assert len(res["runs"][how]["passthrough"]) == 2
    for name in ("passthrough_after_served", "served_after_passthrough"):
        assert res["io_modes"][name]["after_close"] == "ok", res["io_modes"]
    assert not state.exists()
    assert str(state) not in Path("/proc/self/mounts").read_text()
