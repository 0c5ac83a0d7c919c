"""The node's bootseer logs (``[paths] log_dir``) name every user's jobs, checkpoint
files and failures: other users on the node may not read them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import DevSlurm

pytestmark = pytest.mark.slurm

# alice saves through the door (the agent logs it) in a job that asked for bootseer (the
# hooks log it), under names she would rather keep to herself.
SAVE = """#!/bin/sh
set -e
f=$(mktemp)
echo weights > "$f"
bootseer ckpt -q put "$f" takeover-of-acme:bid/final-offer.bin
rm -f "$f"
"""


@pytest.fixture
def targets(cluster: DevSlurm) -> Iterator[list[str]]:
    with cluster.ckpt_targets("logs", unit_size=1 << 18) as uris:
        yield uris


def test_mallory_reads_no_node_log_that_names_alices_jobs(
    cluster: DevSlurm, targets: list[str]
) -> None:
    """Before, the hook and agent logs were 0644: mallory read alice's checkpoint
    namespace and file names (and every job's steps and failures) from them."""
    node = cluster.nodes[0]
    job = cluster.sbatch("-N1", f"-w{node}", "--bootseer=on", script=SAVE, user="alice")
    assert cluster.wait(job) == "COMPLETED", cluster.output(job)
    logs = sorted((cluster.dir / "nodes" / node / "log").rglob("*.log"))
    text = "".join(p.read_text() for p in logs)
    assert "final-offer.bin" in text and f"job={job}" in text, text  # root reads them
    assert cluster.readable_by("mallory", logs) == []
    assert cluster.readable_by("alice", logs) == []  # hers are in report and .bootseer.log
