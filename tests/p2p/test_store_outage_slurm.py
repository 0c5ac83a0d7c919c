"""A hung store costs a job nothing its nodes hold (issue 24, item 3), on Slurm: the S3
store's process is stopped (SIGSTOP: it takes connections and never answers), and a
node whose pieces were evicted but whose records are kept starts the job with bootseer,
its image blocks and snapshot frames from the other node."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import TEST_PORT_BASE, TEST_STATE, DevSlurm, devcluster, own_cluster
from tests.imagekit import make_squashfs
from tests.waiting import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.s3]


@pytest.fixture(scope="module")
def s3_cluster() -> Iterator[DevSlurm]:
    """Two nodes on the S3 store host (SeaweedFS), a cluster of this module's own."""
    if os.geteuid() != 0 or not shutil.which("slurmctld"):
        pytest.skip("the slurm-dev cluster needs root and Debian's Slurm (scripts/bootstrap)")
    settings = devcluster.Settings(
        str(TEST_STATE) + "-outage", nodes=2, port_base=TEST_PORT_BASE + 150, s3=True
    )
    with own_cluster(settings) as cluster:
        yield DevSlurm(cluster)


SCRIPT = """#!/bin/sh
set -e
test -s {prefix}/lib/blob
srun sh -e -c 'sha256sum < "$BOOTSEER_IMAGE" | sed "s/^/image $(hostname) /"; \
test -s {prefix}/lib/blob && echo "deps $(hostname)"'
"""


def test_a_cold_node_starts_with_bootseer_from_its_peer_while_the_store_hangs(
    s3_cluster: DevSlurm,
) -> None:
    cluster = s3_cluster
    cluster.configure("deps", frame_bytes=256 << 10)  # 1 MiB of random bytes: 4 frames
    work = cluster.dir / f"outage-{uuid.uuid4().hex[:8]}"
    work.mkdir(mode=0o755)
    (work / "req.txt").write_text(f"outage=={uuid.uuid4().hex}\n")
    (work / "req.txt").chmod(0o644)
    name = f"outage-{uuid.uuid4().hex[:8]}:1"
    image = make_squashfs(work / "img.sqsh", {"a": 2_000_000}, seed=3)
    image.chmod(0o644)
    subprocess.run(
        [str(Path(sys.executable).parent / "bootseer"), "image", "add", str(image), "--name", name],
        env=cluster.env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    prefix = devcluster.NODE_LOCAL / f"outage-{os.urandom(4).hex()}"
    opts = (f"--bootseer-deps={prefix},key={work}/req.txt", f"--bootseer-image={name}")
    make = f"mkdir -p {prefix}/lib && head -c 1048576 /dev/urandom > {prefix}/lib/blob"
    install = f"#!/bin/sh\nset -e\nbootseer deps run -- sh -c '{make}'\n"
    first = cluster.sbatch("-N1", "-w", "n1", *opts, script=install)
    assert cluster.wait(first, 120) == "COMPLETED", cluster.output(first)

    def forget_prefix(node: str) -> None:
        shutil.rmtree(cluster.dir / "nodes" / node / "local" / prefix.name, ignore_errors=True)

    # Both nodes restore (so each holds every frame) and read the whole image.
    forget_prefix("n1")
    second = cluster.sbatch("-N2", "-w", "n1,n2", *opts, script=SCRIPT.format(prefix=prefix))
    assert cluster.wait(second, 120) == "COMPLETED", cluster.output(second)
    want = hashlib.sha256(image.read_bytes()).hexdigest()
    assert cluster.output(second).count(f"{want}") == 2, cluster.output(second)

    # n2's blocks and frames are evicted (its records, as its cache's LRU would, stay);
    # its prefix is gone. Then the store hangs.
    agent = cluster.cluster.alive("bootseer-agent-n2")
    assert agent
    devcluster_stop(cluster, agent)
    shutil.rmtree(cluster.dir / "nodes" / "n2" / "cache" / "image" / "packs")
    cluster.cluster.start_agent("n2")
    forget_prefix("n2")
    weed = cluster.cluster.alive("weed")
    assert weed
    os.kill(weed, signal.SIGSTOP)
    try:
        third = cluster.sbatch("-N2", "-w", "n1,n2", *opts, script=SCRIPT.format(prefix=prefix))
        # Its tasks done (the epilogs' saves wait on the store: the old fault set's case)
        # Its tasks done; not its epilogs, which wait on the store to save what the job
        # left (the old fault set's case: bounded by the epilog's deadline).
        running = ("PENDING", "CONFIGURING", "RUNNING")
        wait_until(lambda: cluster.job_state(third) not in running, "its tasks", 300, 0.5)
        assert exit_code(cluster, third) == "0:0", cluster.output(third)
    finally:
        os.kill(weed, signal.SIGCONT)
    out = cluster.output(third)
    assert out.count(f"{want}") == 2 and out.count("deps ") == 2, out
    lines = cluster.job_log_lines("n2", third)
    for step in ("image", "deps"):
        (line,) = [ln for ln in lines if f"prolog step={step} " in ln]
        assert "outcome=ok" in line, line
    (restored,) = [ln for ln in lines if "prolog step=deps " in ln]
    assert " restored " in restored and "store_bytes=0 " in restored, restored  # all from n1


def devcluster_stop(cluster: DevSlurm, pid: int) -> None:
    from daemons import stop_pid  # slurm-dev's, as the cluster stops its own

    stop_pid(pid, "bootseer-agent-n2")


def exit_code(cluster: DevSlurm, job: int) -> str:
    r = subprocess.run(
        ["scontrol", "-o", "show", "job", str(job)], env=cluster.env, capture_output=True, text=True
    )
    return next((f.split("=", 1)[1] for f in r.stdout.split() if f.startswith("ExitCode=")), "")
