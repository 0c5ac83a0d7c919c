"""The image benchmark's smoke size, as CI runs it: it must run through and report."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.benchrun import run_bench
from tests.conftest import TEST_PORT_BASE

pytestmark = [pytest.mark.fuse, pytest.mark.s3]


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("squashfuse"), reason="needs root and squashfuse"
)
def test_image_bench_smoke(tmp_path: Path) -> None:
    r = run_bench(
        "image/bench.py",
        "--smoke",
        "--port-base",
        str(TEST_PORT_BASE + 70),
        "--out",
        str(tmp_path),
        timeout=170,
    )
    print(r.stdout)
    s = json.loads((tmp_path / "results.json").read_text())["summary"]
    assert set(s["first_step_s"]) >= {"full", "lazy", "prefetch"}
    assert 0 < s["hot_fraction"] < 1
    # The prefetched start reads no more than the lazy one and far less than a full copy.
    assert s["bytes_before_first_step"]["prefetch"] < s["bytes_before_first_step"]["full"]
