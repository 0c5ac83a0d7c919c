"""Options the site cannot serve are refused at submit, with the option named (issue 22,
item 10): a relative image path, a missing image or ``key=`` file, a checkpoint namespace
on a site without checkpoint storage. They all passed ``sbatch`` and the job ran without
``$BOOTSEER_IMAGE``/``$BOOTSEER_CKPT``, told nothing. What only the prolog can know (a
registered image name that is not registered) is one line on the job's stderr.

Real Slurm, sbatch run as alice: the plugin reads the site config (``$BOOTSEER_CONFIG``,
as every part of bootseer) and looks at files as the submitting user."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DevSlurm

pytestmark = pytest.mark.slurm


@pytest.fixture
def here(cluster: DevSlurm) -> Iterator[Path]:
    """A file ``relative-test.sqsh`` in the directory sbatch runs in (cluster.sbatch's cwd)."""
    f = cluster.dir / "relative-test.sqsh"
    f.write_bytes(b"hsqs")
    f.chmod(0o644)
    try:
        yield f
    finally:
        f.unlink()


def refused(cluster: DevSlurm, *args: str) -> str:
    with pytest.raises(subprocess.CalledProcessError) as err:
        cluster.sbatch(*args, user="alice")
    return str(err.value.stderr)


def test_a_relative_image_path_is_refused_naming_the_absolute_one(
    cluster: DevSlurm, here: Path
) -> None:
    err = refused(cluster, "--bootseer-image=relative-test.sqsh")
    assert "--bootseer-image=relative-test.sqsh: a file of that name is here" in err, err
    assert f"(--bootseer-image={here})" in err, err


def test_a_missing_image_file_is_refused(cluster: DevSlurm, image: Path) -> None:
    missing = image.parent / "no-such.sqsh"
    err = refused(cluster, f"--bootseer-image={missing}")
    assert f"--bootseer-image={missing}: no such file" in err, err


def test_a_missing_key_file_is_refused(cluster: DevSlurm) -> None:
    err = refused(cluster, "--bootseer-deps=/tmp/venv,key=no-such-requirements.txt")
    assert "key file no-such-requirements.txt: no such file (relative to the submit" in err, err


def test_a_checkpoint_namespace_without_checkpoint_storage_is_refused(cluster: DevSlurm) -> None:
    cluster.configure("ckpt", targets=[])
    err = refused(cluster, "--bootseer-ckpt=run1")
    assert "--bootseer-ckpt=run1: this site has no checkpoint storage" in err, err
    assert str(cluster.site_config) in err, err


def test_what_only_the_prolog_can_know_is_one_line_in_the_job(cluster: DevSlurm) -> None:
    job = cluster.sbatch(
        "-N1",
        "--bootseer-image=no-such-registered-image",
        script="#!/bin/sh\necho image=${BOOTSEER_IMAGE:-none}\n",
        user="alice",
    )
    assert cluster.wait(job) == "COMPLETED"
    assert cluster.output(job).strip() == "image=none"
    (notice,) = cluster.notices(job)
    assert "--bootseer-image (failed: " in notice and "no-such-registered-image" in notice
