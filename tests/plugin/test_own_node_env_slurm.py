"""A task gets exactly its own node's ``BOOTSEER_*`` variables (issue 24, item 1).

srun hands every task the environment of the batch script, which runs on the job's first
node. The plugin set what the node's env file held and unset nothing else, so in a 2-node
job whose checkpoint step failed on n2 only, n2's task got n1's ``BOOTSEER_CKPT`` (a path
not mounted on n2: on a real cluster every node has the same run directory, so nothing
even looked wrong). Now every variable the prolog may write (``nodepaths.ENV_NAMES``) that
the node's file does not set is unset; the task's stderr says once, in the prolog's
``BOOTSEER_NOTICE`` line, what the node did not set up and why.

Real Slurm, jobs of alice's: the test, as root, takes n2's mountpoint with a regular file
while the job is held, the way a crashed earlier run or an admin's mistake would."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DevSlurm

pytestmark = pytest.mark.slurm

SCRIPT = (
    "#!/bin/sh\n"
    'echo "batch $SLURMD_NODENAME ckpt=${BOOTSEER_CKPT:-none}"\n'
    "srun -N2 -n2 sh -c 'echo \"task $SLURMD_NODENAME ckpt=${BOOTSEER_CKPT:-none}\"'\n"
)


@pytest.fixture
def targets(cluster: DevSlurm) -> Iterator[list[str]]:
    with cluster.ckpt_targets("ownenv", unit_size=1 << 18) as uris:
        yield uris


def test_a_node_whose_ckpt_step_failed_borrows_no_other_nodes_mount(
    cluster: DevSlurm, targets: list[str]
) -> None:
    n1, n2 = cluster.nodes[:2]
    job = cluster.sbatch(
        "-N2", f"-w{n1},{n2}", "--hold", "--bootseer-ckpt=ownenv", script=SCRIPT, user="alice"
    )
    root = cluster.dir / "nodes" / n2 / "run" / "ckpt"  # [ckpt] mount_root's default
    taken = root / str(job)
    try:
        root.mkdir(mode=0o755, parents=True, exist_ok=True)
        taken.write_text("not a mountpoint\n")
        _scontrol("release", str(job), cluster=cluster)
        assert cluster.wait(job, 180) == "COMPLETED", cluster.output(job, notices=True)
    finally:
        with contextlib.suppress(FileNotFoundError):
            taken.unlink()
    mounted = cluster.dir / "nodes" / n1 / "run" / "ckpt" / str(job)
    assert sorted(cluster.output(job).splitlines()) == [
        f"batch {n1} ckpt={mounted}",
        f"task {n1} ckpt={mounted}",
        f"task {n2} ckpt=none",  # before: n1's path, srun's environment unchanged
    ], cluster.output(job, notices=True)
    (notice,) = cluster.notices(job)  # n2's, once; n1 set up all it was asked for
    assert notice.startswith(f"bootseer on {n2}: not set up: --bootseer-ckpt (failed: "), notice
    assert f"mountpoint {taken} exists and is not a directory" in notice, notice
    assert notice.endswith("; the job runs without it"), notice


def _scontrol(*args: str, cluster: DevSlurm) -> None:
    r = subprocess.run(["scontrol", *args], env=cluster.env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_an_earlier_jobs_variables_do_not_reach_a_job_without_bootseer(
    cluster: DevSlurm, base: Path
) -> None:
    """A job submitted from inside a bootseer job (a chained restart) inherits its
    environment; what named the earlier job's mount and image is gone from its tasks."""
    stale = {"BOOTSEER_CKPT": "/run/bootseer/ckpt/1", "BOOTSEER_IMAGE": "/x.sqsh"}
    out = cluster.dir / "out"
    out.mkdir(exist_ok=True)
    out.chmod(0o1777)
    r = subprocess.run(
        [
            *cluster.as_user("alice"),
            "env",
            *(f"{k}={v}" for k, v in stale.items()),
            "sbatch",
            "--parsable",
            f"--output={out}/%j.out",
            "-N1",
        ],
        input='#!/bin/sh\necho "ckpt=${BOOTSEER_CKPT:-none} image=${BOOTSEER_IMAGE:-none}"\n',
        env=cluster.user_env("alice"),
        capture_output=True,
        text=True,
        cwd=base,
    )
    assert r.returncode == 0, r.stderr
    job = int(r.stdout.strip().split(";")[0])
    assert cluster.wait(job) == "COMPLETED"
    assert cluster.output(job, notices=True).strip() == "ckpt=none image=none"
