"""A slow peer is routed around (issue 24, item 4), on Slurm: one node's link at 1% of
the others', the other nodes take the blocks it owns from the store once they are late
from it, and nobody is dropped for being slow."""

from __future__ import annotations

import os
import re
import shutil
from collections import Counter

import pytest

from bootseer.image.blocks import cut, digest
from bootseer.p2p.owner import owner
from tests.conftest import DevSlurm, squash

pytestmark = pytest.mark.slurm

NODES = ("n1", "n2", "n3")
SLOW = "n3"
SCRIPT = """#!/bin/sh
srun sh -e -c 't0=$(date +%s%N); cat "$BOOTSEER_IMAGE" > /dev/null
echo "read $(hostname) $(( ($(date +%s%N) - t0) / 1000000 )) ms"'
"""


def epilog_counts(cluster: DevSlurm, node: str, job: int) -> dict[str, int]:
    for line in cluster.job_log_lines(node, job):
        if "epilog step=image" in line:
            return {k: int(v) for k, v in re.findall(r" (\w+)=(\d+)(?= |$)", line)}
    raise AssertionError(f"no epilog image step for job {job} on {node}")


def test_a_peer_on_a_slow_link_is_routed_around_not_dropped(cluster: DevSlurm) -> None:
    src = cluster.dir / "straggler-src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir()
    (src / "blob").write_bytes(os.urandom(24 << 20))
    out = cluster.dir / "images" / "straggler.sqsh"
    out.parent.mkdir(exist_ok=True)
    out.unlink(missing_ok=True)
    image = squash(src, out)
    owned = Counter(owner(digest(data), NODES) for _, data in cut(str(image), 256 << 10))
    block = 256 << 10

    network = cluster.cluster.s.network
    slow_mbit = max(1, network.node_mbit // 100)
    network._cap(network.node_netns(SLOW), network.node_link(SLOW), slow_mbit, 0)
    try:
        job = cluster.sbatch(
            "-N3", "-w", ",".join(NODES), f"--bootseer-image={image}", script=SCRIPT
        )
        assert cluster.wait(job, 300) == "COMPLETED", cluster.output(job)
    finally:
        network._cap(network.node_netns(SLOW), network.node_link(SLOW), network.node_mbit, 0)
    took = {m[0]: int(m[1]) for m in re.findall(r"read (\w+) (\d+) ms", cluster.output(job))}
    print(f"task read times, {SLOW}'s link at {slow_mbit} Mbit/s: {took}")
    assert set(took) == set(NODES), cluster.output(job)
    for node in ("n1", "n2"):
        counts = epilog_counts(cluster, node, job)
        assert counts["peer_failures"] == 0, counts  # late, never dead
        # Its own blocks from the store, and at least a quarter of the straggler's too
        # (late from it: asked of the store as well). Main: its own share only.
        assert counts["store_bytes"] >= (owned[node] + owned[SLOW] // 4) * block * 0.95, (
            node,
            counts,
            owned,
        )
