"""A slow peer is routed around (issue 24, item 4), on Slurm: one node's link at 1% of
the others', the other nodes take the blocks it owns from the store once they are late
from it, and nobody is dropped for being slow."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from bootseer.image.manifest import hash_file
from bootseer.p2p.owner import RANGE_BYTES, range_owner_index
from tests.conftest import DevSlurm, random_image

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
    block = 256 << 10
    while True:  # an image of which the slow node owns two ranges at least (of 24)
        image, _ = random_image(cluster, "straggler", 24 << 20)
        m = hash_file(str(image), block)
        first = {d: i for i, d in reversed(list(enumerate(m.blocks)))}
        owned = Counter(NODES[range_owner_index(m.id, i, block, 3)] for i in first.values())
        if owned[SLOW] >= 2 * RANGE_BYTES // block:
            break

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
    counts = {node: epilog_counts(cluster, node, job) for node in ("n1", "n2")}
    for node, c in counts.items():
        assert c["peer_failures"] == 0, (node, c)  # late, never dead
    # Their own blocks from the store, and at least a quarter of the straggler's too
    # (late from it: asked of the store as well; main before issue 24: their own share
    # only). One of them may have had some of the straggler's from the other, asked in
    # the slow node's place (Swarm.source), so the two count together.
    fast = sum(c["store_bytes"] for c in counts.values())
    assert fast >= (owned["n1"] + owned["n2"] + owned[SLOW] // 4) * block * 0.95, (counts, owned)
