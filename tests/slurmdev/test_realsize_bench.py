"""The real-size benchmark's smoke size (issue 19), as CI runs it: N = 1 and 2 on a 2-node
networked slurm-dev cluster of its own (S3 store host behind a 1 Gbit/s link, node links
10 Gbit/s). It must run through and write one well-formed, sane record per path. No timing
targets here: the machine is shared (it must pass at load 10)."""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.benchrun import run_bench
from tests.conftest import TEST_PORT_BASE, TEST_STATE, devcluster, own_cluster

pytestmark = [pytest.mark.slurm, pytest.mark.s3, pytest.mark.timeout(900)]

PATHS = {
    "image_first_read",
    "image_reread",
    "peer_transfer",
    "ckpt_read",
    "ckpt_write",
    "deps_restore",
    "startup_cold_vs_warm",
    "startup_vs_full_copy",
}
FIELDS = {"path", "bytes", "bootseer_s", "floor_s", "ratio", "cpu_s_per_gib", "nodes", "load1"}


@pytest.fixture
def bench_cluster() -> Iterator[devcluster.Cluster]:
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("squashfuse"):
        pytest.skip("the benchmark's cluster needs root, iproute2 and squashfuse")
    settings = devcluster.Settings(
        str(TEST_STATE) + "-realsizebench",
        nodes=2,
        port_base=TEST_PORT_BASE + 130,
        s3=True,
        store_mbit=1000,
        node_mbit=10000,
    )
    with own_cluster(settings) as cluster:
        yield cluster


def test_realsize_bench_smoke(bench_cluster: devcluster.Cluster, tmp_path: Path) -> None:
    out, text = tmp_path / "realsize.json", tmp_path / "realsize.txt"
    work = bench_cluster.dir / "bench"  # the job user reads here (tmp_path is root's)
    r = run_bench(
        "realsize/bench.py",
        "--smoke",
        "--state-dir",
        str(bench_cluster.dir),
        "--work",
        str(work),
        "--json",
        str(out),
        "--text",
        str(text),
        timeout=840,
    )
    print(r.stdout)
    rows = json.loads(out.read_text())
    assert {row["path"] for row in rows} == PATHS, rows
    for n in (1, 2):
        at_n = {row["path"] for row in rows if row["nodes"] == n}
        # the write is measured once (N = 1); peer transfer needs a peer
        assert at_n >= PATHS - {"ckpt_write", "peer_transfer"}, (n, at_n)
    assert {row["nodes"] for row in rows if row["path"] == "peer_transfer"} == {2}
    reads = {(row["nodes"], row.get("variant")) for row in rows if row["path"] == "ckpt_read"}
    assert reads == {(1, "torch.load"), (1, "dcp"), (2, "torch.load"), (2, "dcp")}
    # The job again on the nodes it left: its start and its (skipped) restore.
    again = {(row["path"], row["nodes"]) for row in rows if row.get("variant") == "again"}
    assert again == {(p, n) for p in ("startup_cold_vs_warm", "deps_restore") for n in (1, 2)}
    # The restore, and the image's first start, by jobs that asked for nothing else, on
    # cold nodes: each path alone.
    alone = [row for row in rows if row.get("variant") == "alone"]
    assert {(row["path"], row["nodes"]) for row in alone} == {
        (p, n) for p in ("deps_restore", "image_first_read") for n in (1, 2)
    }
    for row in alone:
        if row["path"] == "deps_restore":
            assert row["restored"] is True and row["fetched"] > 0, row
        else:  # the start read its libraries through the agent's mount
            assert row["bytes"] >= 9 << 20 and all(k > 0 for k in row["agent_reads"]), row
    for row in rows:
        assert set(row) >= FIELDS, row
        assert row["bytes"] > 0, row
        assert row["bootseer_s"] > 0 and row["floor_s"] > 0, row
        assert math.isclose(row["ratio"], row["bootseer_s"] / row["floor_s"], rel_tol=1e-3), row
        assert row["cpu_s_per_gib"] is not None and row["cpu_s_per_gib"] >= 0, row
        assert row["load1"] >= 0, row
    by = {(row["path"], row["nodes"], row.get("variant")): row for row in rows}
    # The smoke image's start reads its libraries whole (9 MiB) through the mount.
    assert by["image_first_read", 1, None]["bytes"] >= 9 << 20
    # Each start says how much of the image file was cached before it, and how many reads
    # reached the agent during it (bootseer's side: the agent's own count).
    for n in (1, 2):
        reread = by["image_reread", n, None]
        assert len(reread["agent_reads"]) == n, reread
        assert all(isinstance(k, int) and k >= 0 for k in reread["agent_reads"]), reread
        assert all(c > 0 for c in reread["cached_before"]), reread
        # The floor's image is the bench's (root's): the job's user cannot see its pages.
        assert all(c == -1 for c in reread["floor_cached_before"]), reread
    # The smoke checkpoint: 2 shards of 8 MiB; at N = 2 each node's own part is one shard.
    assert by["ckpt_read", 1, "torch.load"]["bytes"] == 16 << 20
    assert by["ckpt_read", 2, "dcp"]["bytes"] == 8 << 20
    assert by["deps_restore", 1, None]["restored"] is True
    # The restore's floor: tar run three times in a row on each node, the median kept.
    for row in (r for r in rows if r["path"] == "deps_restore" and r.get("variant") != "again"):
        runs = row["floor_runs_s"]
        assert len(runs) == 3, row
        assert math.isclose(row["floor_s"], sorted(runs)[1], abs_tol=1e-3), row
    # The warm floor: the median of three warm jobs by their start.
    for n in (1, 2):
        row = by["startup_cold_vs_warm", n, None]
        runs = row["floor_runs_s"]
        assert len(runs) == 3 and math.isclose(row["floor_s"], sorted(runs)[1], abs_tol=1e-3), row
    # Where each cold start's CPU went: bootseer's part of the nodes', the store's, and
    # what the start could take were bootseer's free.
    for n in (1, 2):
        cpu = by["startup_cold_vs_warm", n, None]["story"]["cpu"]
        assert cpu["cores"] >= 1 and cpu["wall_s"] > 0, cpu
        assert 0 < cpu["bootseer_cpu_s"] <= cpu["nodes_cpu_s"] + 0.5, cpu
        assert cpu["store_cpu_s"] > 0 and cpu["warm_nodes_cpu_s"] > 0, cpu
        assert 0 <= cpu["bound_s"] <= cpu["wall_s"] + 0.5, cpu
    assert "image_first_read" in text.read_text()
    assert "were bootseer free" in text.read_text()
    # The bench leaves none of its per-node CPU cgroups behind, nor its node scratch.
    assert not (
        Path("/sys/fs/cgroup/cpuacct") / f"bootseer-realsize-bench-{TEST_PORT_BASE + 130}"
    ).exists()
    for node in bench_cluster.s.node_names:
        assert not (bench_cluster.dir / "nodes" / node / "local" / "realsize-bench").exists()
