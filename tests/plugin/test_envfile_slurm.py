"""A job's state on its nodes (``<run_dir>/jobs/<id>/``) is no other user's to read.

The prolog leaves there what the job's tasks and its ``bootseer deps run`` need: the env
file the SPANK plugin puts into the tasks (the image, the checkpoint namespace, the deps
prefix), the deps prolog's state, the checkpoint mount's record. They were 0644 in 0755
directories, read by the plugin as the job's user: mallory, on the node, read alice's
image path, checkpoint namespace and prefix from them."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DevSlurm, devcluster
from tests.waiting import wait_until

pytestmark = pytest.mark.slurm

PREFIX = devcluster.NODE_LOCAL / "envfile-secret-prefix"
NAMESPACE = "takeover-of-acme"


@pytest.fixture
def targets(cluster: DevSlurm) -> Iterator[list[str]]:
    with cluster.ckpt_targets("envfile", unit_size=1 << 18) as uris:
        yield uris


def test_mallory_reads_nothing_of_alices_job_state_on_the_node(
    cluster: DevSlurm, targets: list[str], base: Path
) -> None:
    node = cluster.nodes[0]
    shutil.rmtree(cluster.dir / "nodes" / node / "local" / PREFIX.name, ignore_errors=True)
    go = base / "go"
    script = (
        "#!/bin/sh\nset -e\n"
        'echo "prefix=$BOOTSEER_DEPS_PREFIX ckpt=$BOOTSEER_CKPT"\n'
        "bootseer deps run -- sh -c 'mkdir -p \"$BOOTSEER_DEPS_PREFIX/bin\"'\n"
        "echo ready\n"
        f"i=0; while [ ! -e {go} ]; do i=$((i+1)); "
        '[ $i -gt 1200 ] && echo "no go" && exit 1; sleep 0.1; done\n'
    )
    job = cluster.sbatch(
        "-N1",
        f"-w{node}",
        f"--bootseer-deps={PREFIX}",
        f"--bootseer-ckpt={NAMESPACE}",
        script=script,
        user="alice",
    )
    out = cluster.dir / "out" / f"{job}.out"
    try:
        wait_until(lambda: out.exists() and "ready" in out.read_text(), f"job {job} ready", 120)
        # The plugin still hands alice's tasks what the prolog prepared, and her deps run
        # still finds the prolog's state.
        text = out.read_text()
        assert f"prefix={PREFIX} " in text and "ckpt=/" in text, text
        assert "the epilog captures them" in text, text
        jobdir = cluster.dir / "nodes" / node / "run" / "jobs" / str(job)
        files = sorted(p for p in jobdir.rglob("*") if p.is_file())
        names = {p.relative_to(jobdir).as_posix() for p in files}
        assert {"env", "deps/prolog.json", "ckpt/mount.json"} <= names, names
        env = (jobdir / "env").read_text()
        assert str(PREFIX) in env and "BOOTSEER_CKPT=" in env, env  # root reads them
        assert cluster.readable_by("mallory", files) == []
        assert (jobdir / "env").stat().st_mode & 0o777 == 0o600
        listing = subprocess.run(
            [*cluster.as_user("mallory"), "ls", "-R", str(jobdir)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert PREFIX.name not in listing.stdout and NAMESPACE not in listing.stdout
    finally:
        go.touch()
    assert cluster.wait(job) == "COMPLETED", cluster.output(job)
