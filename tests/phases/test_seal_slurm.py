"""Forged phase rows on a real cluster (issue 21.2): mallory, had she write access to the
store, adds a node that was never alice's to alice's job. Root's report counts only what
root's flushes sealed; alice's report, which has no key, checks the job against Slurm."""

from __future__ import annotations

import time

import pytest

from bootseer.phases.writer import write_rows
from bootseer.sitekey import SiteKeys
from tests.conftest import DevSlurm
from tests.phases.conftest import node_rows
from tests.phases.test_phases_slurm import BOOTSEER

pytestmark = pytest.mark.slurm

MALLORY_KEYS = SiteKeys([b"mallory-minted-no-site-key-0123456789"])


def test_a_node_that_was_never_alices_is_not_counted_by_her_report_or_roots(
    cluster: DevSlurm,
) -> None:
    job = cluster.sbatch(
        "-N2", "--bootseer=on", script=f"#!/bin/sh\nsrun -N2 -n2 {BOOTSEER} phase end first_step\n"
    )
    assert cluster.wait(job) == "COMPLETED", cluster.output(job)
    (run,) = cluster.report_json(job)["runs"]
    ours = sorted(n["node"] for n in run["nodes"])
    assert len(ours) == 2
    other = next(n for n in cluster.nodes if n not in ours)
    store = cluster.cluster.open_store()
    t0 = time.time() - 60
    rows = node_rows(job, other, nodes=2, t0=t0)
    rows = [r.__class__.from_dict({**r.to_dict(), "user": "alice"}) for r in rows]
    unsealed = write_rows(store, rows, "epilog")  # a file anyone could write
    write_rows(store, rows, "epilog", keys=MALLORY_KEYS)  # one that looks sealed

    root = cluster.report_json(job)
    assert sorted(n["node"] for n in root["runs"][0]["nodes"]) == ours
    assert root["seals"]["checked"] and root["seals"]["files_refused"] == 2, root["seals"]
    text = cluster.report(str(job)).stdout
    assert "2 phase file(s)" in text and "not counted" in text, text

    alice = cluster.report_json(job, user="alice")
    assert sorted(n["node"] for n in alice["runs"][0]["nodes"]) == ours
    assert alice["seals"]["checked"] is False and alice["seals"]["unsealed"] == [unsealed]
    assert list(alice["slurm_check"]["rows_dropped_by_node"]) == [other]
    text = cluster.report(str(job), user="alice").stdout
    assert f"node(s) {other} are not the job's" in " ".join(text.split()), text
    assert "Seals not checked" in text
