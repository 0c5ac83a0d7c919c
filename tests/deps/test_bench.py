"""The dependency benchmark's smoke size, as CI runs it: pip, uv, restore and the tar floor
on a 2-node slurm-dev cluster of its own with the S3 store host; it must run through,
every node must restore, and the report must hold every method."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.benchrun import run_bench
from tests.conftest import TEST_PORT_BASE, TEST_STATE, devcluster, own_cluster

pytestmark = [pytest.mark.slurm, pytest.mark.s3]


@pytest.fixture
def bench_cluster() -> Iterator[devcluster.Cluster]:
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("the benchmark's cluster needs root and iproute2")
    state = str(TEST_STATE) + "-depsbench"
    settings = devcluster.Settings(
        state, nodes=2, port_base=TEST_PORT_BASE + 90, s3=True, store_mbit=400
    )
    with own_cluster(settings) as cluster:
        yield cluster


def test_deps_bench_smoke(bench_cluster: devcluster.Cluster, tmp_path: Path) -> None:
    out = tmp_path / "deps.json"
    r = run_bench(
        "deps/bench.py",
        "--smoke",
        "--state-dir",
        str(bench_cluster.dir),
        "--json",
        str(out),
        timeout=600,
        env={**os.environ, "BOOTSEER_BENCH_DIR": str(tmp_path / "work")},
    )
    print(r.stdout)
    got = json.loads(out.read_text())
    methods = {"pip", "uv", "restore", "restore-local", "floor"}
    assert set(got["results"]) == methods
    for method in methods:  # one figure per node, each a real duration
        assert set(got["results"][method]) == set(bench_cluster.s.node_names), method
        assert all(s > 0 for s in got["results"][method].values()), method
    assert got["medians"]["restore"] < got["medians"]["pip"]
