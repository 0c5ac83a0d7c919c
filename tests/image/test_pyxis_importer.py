"""The pyxis importer, called exactly as pyxis calls it (tests/pyxiskit.py): as the job's
user, with pyxis' environment, stdin on /dev/null, stdout read for one line."""

from __future__ import annotations

import os
import pwd
import sys
from pathlib import Path

import pytest

from tests import pyxiskit
from tests.conftest import TOP

IMPORTER = str(TOP / "contrib" / "pyxis" / "bootseer-importer")

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="pyxis runs the importer as the job's user"),
]


def job_env(**extra: str) -> dict[str, str]:
    """A job step's environment as slurmstepd holds it (what S_JOB_ENV gives pyxis)."""
    return {
        "PATH": "/home/alice/bin:/usr/bin:/bin",  # the job's: pyxis drops it
        "HOME": "/home/alice",
        "USER": "alice",
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "0",
        "BOOTSEER_PYTHON": sys.executable,  # the venv's: the job exported it
        **extra,
    }


@pytest.fixture
def enroot(base: Path) -> Path:
    """``enroot`` on slurmstepd's PATH: this machine has none, and the importer's contract
    with it is its command line. It records that and writes the file it was asked for."""
    bindir = base / "bin"
    bindir.mkdir()
    tool = bindir / "enroot"
    tool.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$@" > {base}/pyxis/enroot-argv\n'
        'echo "[INFO] Fetching image" >&2\n'
        'printf hsqs > "$3"\n'
    )
    tool.chmod(0o755)
    (base / "pyxis").mkdir(mode=0o1777)
    (base / "pyxis").chmod(0o1777)
    (base / "log").chmod(0o777)
    return bindir


def test_container_image_bootseer_gets_the_jobs_lazy_image(image: Path) -> None:
    uri = pyxiskit.enroot_uri("bootseer")
    assert uri == "docker://bootseer"  # what pyxis passes for --container-image=bootseer
    env = job_env(BOOTSEER_IMAGE=str(image))
    got = pyxiskit.call(IMPORTER, ["get", uri], env, user="alice")
    assert got.returncode == 0, got.log
    assert got.stdout == f"{image}\n"  # one line, the path: nothing else on stdout
    # --container-image=docker://bootseer arrives the same way; a call by hand too.
    assert pyxiskit.enroot_uri("docker://bootseer") == uri
    by_hand = pyxiskit.call(IMPORTER, ["get", "bootseer"], env, user="alice")
    assert by_hand.path == str(image), by_hand.log
    for _ in range(2):  # pyxis releases twice; the lazy image is the epilog's to release
        assert pyxiskit.call(IMPORTER, ["release"], env, user="alice").returncode == 0
    assert image.is_file()


def test_the_jobs_pythonpath_and_working_directory_do_not_choose_the_code(
    image: Path, base: Path
) -> None:
    """pyxis passes the job's PYTHONPATH on; a job run from a project with a ``bootseer``
    package of its own (a checkout, a name clash) must still get bootseer's importer."""
    project = base / "project"
    (project / "bootseer").mkdir(parents=True)
    (project / "bootseer" / "__init__.py").write_text(
        "raise SystemExit('the job\\'s own bootseer')\n"
    )
    os.chmod(project, 0o755)
    env = job_env(BOOTSEER_IMAGE=str(image), PYTHONPATH=str(project))
    got = pyxiskit.call(IMPORTER, ["get", "docker://bootseer"], env, user="alice", cwd=str(project))
    assert (got.returncode, got.path) == (0, str(image)), got.log


@pytest.mark.parametrize(
    "image",
    [
        "ubuntu:24.04",
        "bootseer:1.0",  # a tag: a Docker image named bootseer, not the job's
        "nvcr.io#nvidia/pytorch:24.05-py3",
        "library/bootseer",
        "dockerd://bootseer",
    ],
)
def test_a_docker_image_that_is_not_ours_goes_to_enroot_import(
    image: str, base: Path, enroot: Path
) -> None:
    uri = pyxiskit.enroot_uri(image)
    env = job_env(BOOTSEER_IMAGE="/nonexistent/lazy.sqsh")
    runtime = str(base / "pyxis")
    got = pyxiskit.call(
        IMPORTER,
        ["get", uri],
        env,
        user="alice",
        runtime_path=runtime,
        path=f"{enroot}:{pyxiskit.SLURMSTEPD_PATH}",
    )
    out = f"{runtime}/{pwd.getpwnam('alice').pw_uid}/4242.0.squashfs"
    assert got.returncode == 0, got.log
    assert got.stdout == f"{out}\n"  # enroot's chatter went to the log, not stdout
    assert "Fetching image" in got.log
    assert (base / "pyxis" / "enroot-argv").read_text().split("\n")[:-1] == [
        "import",
        "--output",
        out,
        uri,
    ]
    assert Path(out).stat().st_uid == pwd.getpwnam("alice").pw_uid
    for _ in range(2):
        rel = pyxiskit.call(IMPORTER, ["release"], env, user="alice", runtime_path=runtime)
        assert rel.returncode == 0, rel.log
    assert not Path(out).exists()


def test_bootseer_in_a_job_without_a_lazy_image_fails_with_the_reason(base: Path) -> None:
    env = job_env(BOOTSEER_CONFIG=str(base / "no-such-config.toml"))
    got = pyxiskit.call(IMPORTER, ["get", "docker://bootseer"], env, user="alice")
    assert got.returncode == 1 and got.path is None
    assert "no lazy image for job 4242" in got.log and "--bootseer-image" in got.log, got.log


def test_usage_errors_print_nothing_on_stdout() -> None:
    for args in (["get"], ["get", "a", "b"], ["put", "x"], ["release", "x"]):
        got = pyxiskit.call(IMPORTER, args, job_env(), user="alice")
        assert got.returncode == 2 and not got.stdout and "usage" in got.log
