"""A restart on a node whose prefix already holds the job's snapshot (the stamp says so)
costs the prolog no more than finding the snapshot's key: it parses no manifest (torch's
16,000 entries took 40 ms) and writes the snapshot's last-use mark to the store at most
once an hour per node (a store write the prolog waited for). The deps step of such a
restart went from 0.16-0.19 s to 0.07-0.10 s on the realsize bench's torch install
(docs/deps.md, "A restart on the same node")."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.conftest import DevSlurm
from tests.deps.conftest import fresh_deps
from tests.opens import OpenCounter

pytestmark = pytest.mark.slurm


def test_a_restart_in_place_reads_no_manifest_and_marks_the_store_once(
    cluster: DevSlurm,
) -> None:
    _, prefix, deps = fresh_deps(cluster.dir, "restart")
    install = f"#!/bin/sh\nset -e\nbootseer deps run -- sh -c 'mkdir -p {prefix}/bin'\n"
    first = cluster.sbatch("-w", "n1", deps, script=install)
    assert cluster.wait(first, 120) == "COMPLETED", cluster.output(first)
    store = cluster.dir / "store"
    manifests = (store / "deps").glob("user/alice/*/manifest.json")
    (manifest,) = [m for m in manifests if str(prefix) in m.read_text()]
    used = manifest.with_name("used")
    # The node's own copy of the manifest (bootseer.recordcache), by its store path.
    name = hashlib.sha256(str(manifest.relative_to(store)).encode()).hexdigest()
    copy = cluster.dir / "nodes" / "n1" / "cache" / "records" / name

    def again() -> dict[Path, int]:
        watched = [p for p in (manifest, copy, used) if p.exists()]
        with OpenCounter(watched) as opens:
            job = cluster.sbatch("-w", "n1", deps, script=install)
            assert cluster.wait(job, 120) == "COMPLETED", cluster.output(job)
            (line,) = [ln for ln in cluster.job_log_lines("n1", job) if "prolog step=deps" in ln]
            assert "outcome=ok" in line and "already in" in line, line
            assert "skipping the install" in cluster.output(job)
            return opens.counts()

    again()  # marks the snapshot used (the install's prolog found none to mark)
    assert used.exists()
    mark = used.read_bytes()
    counts = again()
    assert counts == {p: 0 for p in counts}, counts  # main: the copy read, the mark written
    assert used.read_bytes() == mark
