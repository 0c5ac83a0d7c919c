"""A user's ``bootseer deps ls|show`` and ``image show`` inside her Slurm job: the node
agent answers them (users may not read the store's snapshots and image records), with
her own snapshots and traces only. Jobs of alice and mallory on the slurm-dev cluster."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DevSlurm, devcluster
from tests.imagekit import make_squashfs

pytestmark = pytest.mark.slurm


def test_a_users_views_in_her_job_show_hers_only(cluster: DevSlurm, base: Path) -> None:
    node = cluster.nodes[2]
    prefix = devcluster.NODE_LOCAL / f"views-{uuid.uuid4().hex[:8]}"
    req = base / "req.txt"
    req.write_text(f"views=={uuid.uuid4().hex}\n")
    req.chmod(0o644)
    install = f"mkdir -p {prefix}/bin && echo alices > {prefix}/bin/tool"
    job = cluster.sbatch(
        f"-w{node}",
        f"--bootseer-deps={prefix},key={req}",
        script=f"#!/bin/sh\nset -e\nbootseer deps run -- sh -c '{install}'\n",
        user="alice",
    )
    assert cluster.wait(job, 120) == "COMPLETED", cluster.output(job)
    name = f"views-{uuid.uuid4().hex[:8]}:1"
    squashfs = make_squashfs(base / "img.sqsh", {"a": 200_000}, seed=41)
    bootseer = str(Path(sys.executable).parent / "bootseer")
    subprocess.run(
        [bootseer, "image", "add", str(squashfs), "--name", name, "--trace-owner", "bob"],
        env=cluster.env,
        check=True,
        capture_output=True,
        timeout=120,
    )

    def views(who: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        script = (
            "#!/bin/sh\nset -e\n"
            "srun bootseer deps ls --json\necho ===\n"
            f"srun bootseer image show {name}\n"
        )
        j = cluster.sbatch(f"-w{node}", script=script, user=who)
        assert cluster.wait(j, 120) == "COMPLETED", cluster.output(j)
        snaps, image = cluster.output(j).split("===\n")
        return json.loads(snaps), json.loads(image)

    alices, image = views("alice")
    mine = [s for s in alices if s["scope"] == "user/alice"]
    assert mine and all(s["scope"] == "user/alice" for s in alices), alices
    assert image["trace_owner"] == "bob" and image["blocks"] >= 1, image
    mallorys, _ = views("mallory")
    assert all(s["scope"] == "user/mallory" for s in mallorys), mallorys
    assert not {s["key"] for s in mine} & {s["key"] for s in mallorys}
    # alice's deps show of her snapshot, in a job: its files, from the verified manifest.
    key = mine[-1]["key"]
    j = cluster.sbatch(
        f"-w{node}", script=f"#!/bin/sh\nsrun bootseer deps show {key} --files\n", user="alice"
    )
    assert cluster.wait(j, 120) == "COMPLETED", cluster.output(j)
    assert f"snapshot  {key} (user/alice)" in cluster.output(j), cluster.output(j)
    j = cluster.sbatch(
        f"-w{node}",
        script=f"#!/bin/sh\nsrun bootseer deps show {key} --scope user/alice\n",
        user="mallory",
    )
    assert cluster.wait(j, 120) == "FAILED"
    assert "is not one your jobs restore from" in cluster.output(j), cluster.output(j)
