"""Manifests are read once per node (issue 24, item 5): a node keeps the sealed records
its prologs read, so a second job on it reads no manifest from the store."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import DevSlurm
from tests.deps.conftest import fresh_deps
from tests.imagekit import make_squashfs
from tests.opens import OpenCounter

pytestmark = pytest.mark.slurm
TRUE = "#!/bin/sh\ntrue\n"


def test_a_second_job_on_a_node_reads_no_manifest_from_the_store(cluster: DevSlurm) -> None:
    # (the snapshot's key covers the image: every job here names both)
    work, prefix, deps = fresh_deps(cluster.dir, "records")
    make = f"mkdir -p {prefix}/bin && date > {prefix}/bin/x"
    install = f"#!/bin/sh\nset -e\nbootseer deps run -- sh -c '{make}'\n"

    name = f"records-{uuid.uuid4().hex[:8]}:1"
    image = make_squashfs(work / "img.sqsh", {"a": 300_000}, seed=24)
    added = subprocess.run(
        [str(Path(sys.executable).parent / "bootseer"), "image", "add", str(image), "--name", name],
        env=cluster.env,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    image_id = added.stdout.split("image ", 1)[1].split()[0]
    first = cluster.sbatch("-w", "n1", deps, f"--bootseer-image={name}", script=install)
    assert cluster.wait(first, 120) == "COMPLETED", cluster.output(first)
    store = cluster.dir / "store"
    image_manifest = store / "images" / "manifests" / f"{image_id}.json"
    manifests = (store / "deps").glob("user/alice/*/manifest.json")
    (snapshot_manifest,) = [m for m in manifests if str(prefix) in m.read_text()]

    def job_on_n2() -> tuple[int, dict[Path, int]]:
        with OpenCounter([image_manifest, snapshot_manifest]) as opens:
            job = cluster.sbatch("-w", "n2", deps, f"--bootseer-image={name}", script=TRUE)
            assert cluster.wait(job, 120) == "COMPLETED", cluster.output(job)
            lines = cluster.job_log_lines("n2", job)
            (restore,) = [ln for ln in lines if "prolog step=deps" in ln]
            assert "outcome=ok" in restore, restore
            assert any("prolog step=image outcome=ok" in ln for ln in lines), lines
            return job, opens.counts()

    _, cold = job_on_n2()
    assert cold[image_manifest] >= 1 and cold[snapshot_manifest] >= 1, cold  # the watch sees reads
    _, warm = job_on_n2()
    assert warm == {image_manifest: 0, snapshot_manifest: 0}, warm
