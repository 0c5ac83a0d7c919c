"""The startup benchmark's smoke size, as CI runs it: N = 1 and 4 on a 4-node networked
slurm-dev cluster of its own (S3 store host behind a 100 Mbit/s link, node links 1 Gbit/s),
baseline and bootseer; it must run through and write one sane record per point. No
timing targets here: the machine is shared."""

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

FIELDS = {"variant", "nodes", "startup_s", "spread", "store_egress_bytes", "peer_bytes"}


@pytest.fixture
def bench_cluster() -> Iterator[devcluster.Cluster]:
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("squashfuse"):
        pytest.skip("the benchmark's cluster needs root, iproute2 and squashfuse")
    settings = devcluster.Settings(
        str(TEST_STATE) + "-startupbench",
        nodes=4,
        port_base=TEST_PORT_BASE + 110,
        s3=True,
        store_mbit=100,
        node_mbit=1000,
    )
    with own_cluster(settings) as cluster:
        yield cluster


def test_startup_bench_smoke(bench_cluster: devcluster.Cluster, tmp_path: Path) -> None:
    out = tmp_path / "startup.json"
    work = bench_cluster.dir / "bench"  # the job user reads and writes here (tmp_path is root's)
    r = run_bench(
        "startup/bench.py",
        "--smoke",
        "--state-dir",
        str(bench_cluster.dir),
        "--json",
        str(out),
        timeout=300,
        env={**os.environ, "BOOTSEER_BENCH_DIR": str(work)},
    )
    print(r.stdout)
    rows = json.loads(out.read_text())
    assert [(row["variant"], row["nodes"]) for row in rows] == [
        ("baseline", 1),
        ("bootseer", 1),
        ("baseline", 4),
        ("bootseer", 4),
    ]
    # The smoke checkpoint is 16 MiB; every node reads all of it, and the store sends it.
    ckpt = 16 << 20
    for row in rows:
        assert set(row) >= FIELDS, row
        n = row["nodes"]
        assert row["startup_s"] > 0
        assert 0 <= row["spread"] < 5
        assert len(row["ready_s"]) == n
        assert 0 < row["holds_s"] <= row["startup_s"]
        assert row["peer_bytes"] >= 0
        assert row["store_egress_job_bytes"] >= row["store_egress_bytes"] > 0
        # Without peer-to-peer every node's bytes come from the store; with it, at least
        # one copy of the checkpoint still does.
        assert row["store_egress_bytes"] + row["peer_bytes"] >= n * ckpt
        assert row["store_egress_bytes"] >= ckpt
        if row["cpu_s_per_node"] is not None:
            assert row["cpu_s_per_node"] > 0
        assert row["load1"] >= 0
    boot = [row for row in rows if row["variant"] == "bootseer"]
    assert all(row["deps"] == "restored" for row in boot), boot
    # The bench leaves none of its per-node CPU cgroups behind.
    cgroup = Path("/sys/fs/cgroup/cpuacct") / f"bootseer-startup-bench-{TEST_PORT_BASE + 110}"
    assert not cgroup.exists()
