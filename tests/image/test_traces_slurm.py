"""Image traces in real Slurm jobs of alice, bob and mallory: a job prefetches its image
owner's trace (a path image's: the file's owner), then its own user's; mallory's jobs
change neither (the same through the agent alone: test_image_traces.py)."""

from __future__ import annotations

import os
import pwd
import random
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import DevSlurm, squash

pytestmark = pytest.mark.slurm

# How much of the image a job reads through the agent's lazy file while it starts.
READ = "#!/bin/sh\nsrun sh -e -c '{cmd} \"$BOOTSEER_IMAGE\" > /dev/null'\n"
ALL, START = READ.format(cmd="cat"), READ.format(cmd="head -c 100")


def hot_blocks(cluster: DevSlurm, node: str, job: int) -> int:
    for line in cluster.job_log_lines(node, job):
        if "prolog step=image" in line and (m := re.search(r"hot_blocks=(\d+)", line)):
            return int(m.group(1))
    raise AssertionError(f"no prolog image step for job {job} on {node}")


def run(cluster: DevSlurm, image: Path, user: str, script: str, node: str) -> int:
    job = cluster.sbatch("-N1", f"-w{node}", f"--bootseer-image={image}", script=script, user=user)
    assert cluster.wait(job) == "COMPLETED", cluster.output(job)
    return hot_blocks(cluster, node, job)


def test_mallorys_jobs_do_not_change_what_others_prefetch_of_alices_image(
    cluster: DevSlurm,
) -> None:
    src = cluster.dir / "traces-src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir()
    (src / "weights").write_bytes(random.Random(7).randbytes(4_000_000))
    image = cluster.dir / "images" / "alices-team.sqsh"
    image.parent.mkdir(exist_ok=True)
    image.unlink(missing_ok=True)
    squash(src, image)  # 0644: every job user may run it
    alice = pwd.getpwnam("alice")
    os.chown(image, alice.pw_uid, alice.pw_gid)
    n1, n2, n3 = cluster.nodes[:3]
    assert run(cluster, image, "mallory", ALL, n1) == 0
    # Before, the image's one trace was mallory's: every block, for bob and alice alike.
    assert run(cluster, image, "bob", START, n2) == 0
    assert run(cluster, image, "alice", START, n3) == 0
    alices = run(cluster, image, "alice", START, n1)
    assert 0 < alices < 16, alices  # of 16 blocks (256 KiB)
    # The file's owner leads: bob's job prefetches alice's trace, mallory's adds nothing.
    assert run(cluster, image, "mallory", ALL, n2) > alices  # her own, for her jobs only
    assert run(cluster, image, "bob", START, n3) == alices
