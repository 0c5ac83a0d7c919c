"""The hooks and the SPANK plugin on a real 4-node Slurm cluster (slurm-dev)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import DevSlurm

pytestmark = pytest.mark.slurm


def test_sbatch_help_lists_the_options(cluster: DevSlurm) -> None:
    r = subprocess.run(["sbatch", "--help"], env=cluster.env, capture_output=True, text=True)
    for opt in (
        "--bootseer=[MODE]",
        "--bootseer-image=IMAGE",
        "--bootseer-deps=SPEC",
        "--bootseer-ckpt=SPEC",
    ):
        assert opt in r.stdout


def test_four_node_job_runs_prolog_and_epilog_on_every_node(cluster: DevSlurm, image: Path) -> None:
    # --bootseer without a value, then srun inside: the step re-reads the options.
    job = cluster.sbatch(
        "-N4",
        "--bootseer",
        f"--bootseer-image={image}",
        script="#!/bin/sh\nprintenv BOOTSEER_IMAGE\n"
        "srun -N4 -n4 sh -c 'echo $(hostname) $BOOTSEER_IMAGE' | sort\n",
    )
    assert cluster.wait(job) == "COMPLETED"
    for node in cluster.nodes:
        lines = cluster.job_log_lines(node, job)
        text = "\n".join(lines)
        assert "prolog start" in text and "prolog step=image outcome=ok" in text, (node, text)
        assert "epilog start" in text and "epilog done" in text, (node, text)

    # The batch script and every task on every node found the image the prolog prepared:
    # each node's agent serves it lazily from that node's FUSE mount.
    def lazy(node: str) -> str:
        return str(cluster.dir / "nodes" / node / "images" / f"{job}.sqsh")

    lines = cluster.output(job).splitlines()
    assert lines == [lazy(cluster.nodes[0])] + [f"{node} {lazy(node)}" for node in cluster.nodes]


def test_job_without_bootseer_runs_no_step(cluster: DevSlurm) -> None:
    job = cluster.sbatch("-N4", script="#!/bin/sh\nprintenv BOOTSEER_IMAGE || echo none\n")
    assert cluster.wait(job) == "COMPLETED"
    for node in cluster.nodes:
        assert cluster.job_log_lines(node, job) == []
    assert cluster.output(job).strip() == "none"


def test_mode_off_runs_no_step(cluster: DevSlurm, image: Path) -> None:
    job = cluster.sbatch("-N2", "--bootseer=off", f"--bootseer-image={image}")
    assert cluster.wait(job) == "COMPLETED"
    for node in cluster.nodes:
        assert cluster.job_log_lines(node, job) == []


@pytest.mark.parametrize(
    ("option", "needle"),
    [
        ("--bootseer=fast", "MODE must be one of on, off, refresh"),
        ("--bootseer-image=../etc/shadow", "absolute path"),
        ("--bootseer-image=/images/../../etc/shadow", "'.' or '..'"),
        ("--bootseer-deps=relative/venv", "PREFIX must be an absolute path"),
        ("--bootseer-deps=/tmp/venv,scope=world", "scope must be one of"),
        ("--bootseer-ckpt=../other-user/ckpt", "NAMESPACE"),
        ("--bootseer-ckpt=/abs", "NAMESPACE"),
    ],
)
def test_bad_option_value_is_refused_at_submit(cluster: DevSlurm, option: str, needle: str) -> None:
    with pytest.raises(subprocess.CalledProcessError) as err:
        cluster.sbatch(option)
    name = option.split("=")[0]
    assert name in err.value.stderr
    assert needle in err.value.stderr


def test_failing_step_lets_job_run_and_node_stays_idle(cluster: DevSlurm, image: Path) -> None:
    cluster.configure("hooks", failpoints=["image:raise"])
    job = cluster.sbatch(
        "-N4",
        f"--bootseer-image={image}",
        script="#!/bin/sh\necho ran; printenv BOOTSEER_IMAGE || echo no-image\n",
    )
    assert cluster.wait(job) == "COMPLETED"
    assert cluster.output(job).split() == ["ran", "no-image"]
    (notice,) = cluster.notices(job)
    # The job is told on its stderr what it asked for and did not get, and why.
    assert notice.startswith(f"bootseer on {cluster.nodes[0]}: not set up: --bootseer-image ")
    assert "(failed: " in notice and "failpoint image:raise" in notice
    for node in cluster.nodes:
        text = "\n".join(cluster.job_log_lines(node, job))
        assert "step=image outcome=failed" in text and "failpoint image:raise" in text
    states = cluster.node_states()
    assert all(s.startswith("idle") for s in states.values()), states


def test_every_node_without_its_mount_tells_the_job_on_stderr(cluster: DevSlurm) -> None:
    """A job that asked for --bootseer-ckpt and cannot have its mount hears so from each
    node's first task, on stderr, in one line; the variable is absent. The mount really
    fails: its daemon cannot open the checkpoint target and exits before mounting."""
    cluster.configure("ckpt", targets=["file:///proc/bootseer-no-such-target/ckpt"])
    job = cluster.sbatch(
        "-N2",
        "--bootseer-ckpt=notice-test",
        script="#!/bin/sh\nsrun sh -c 'echo \"$SLURMD_NODENAME ckpt=${BOOTSEER_CKPT:-none}\"'\n",
    )
    assert cluster.wait(job) == "COMPLETED"
    nodes = cluster.nodes[:2]
    assert sorted(cluster.output(job).splitlines()) == [f"{n} ckpt=none" for n in nodes]
    notices = cluster.notices(job)
    # Once per node, though n1 ran two steps (the batch script and srun's).
    told = sorted(x.split()[2].rstrip(":") for x in notices)
    assert told == sorted(nodes), notices
    for x in notices:
        assert "--bootseer-ckpt (failed: checkpoint mount daemon for alice/notice-test" in x, x
        assert "exited with status 1 before mounting" in x, x
    states = cluster.node_states()
    assert all(s.startswith("idle") for s in states.values()), states


def test_failed_deps_step_still_tells_the_job_its_prefix(cluster: DevSlurm) -> None:
    """The job's install command names $BOOTSEER_DEPS_PREFIX: without it `deps run` would
    install into "" and the job fail its task while Slurm says COMPLETED."""
    cluster.configure("hooks", failpoints=["deps:raise"])
    prefix = "/var/tmp/slurm-dev-local/alice-failed-deps-env"
    job = cluster.sbatch(
        "-N2",
        f"--bootseer-deps={prefix}",
        script="#!/bin/sh\nsrun sh -c 'echo prefix=$BOOTSEER_DEPS_PREFIX'\n",
    )
    assert cluster.wait(job) == "COMPLETED"
    assert cluster.output(job).split() == [f"prefix={prefix}"] * 2
    told = sorted(x.split()[2].rstrip(":") for x in cluster.notices(job))
    assert told == sorted(cluster.nodes[:2])  # each node says so, once
    assert all("--bootseer-deps (failed: " in x for x in cluster.notices(job))
    for node in cluster.nodes[:2]:
        assert "step=deps outcome=failed" in "\n".join(cluster.job_log_lines(node, job))


def test_step_past_its_deadline_is_skipped(cluster: DevSlurm, image: Path) -> None:
    cluster.configure("hooks", failpoints=["image:hang"], step_deadlines={"image": 1.5})
    job = cluster.sbatch("-N2", f"--bootseer-image={image}", script="#!/bin/sh\necho ran\n")
    assert cluster.wait(job) == "COMPLETED"
    assert cluster.output(job).strip() == "ran"
    for node in cluster.nodes[:2]:
        text = "\n".join(cluster.job_log_lines(node, job))
        assert "step=image outcome=timed_out deadline=1.5s" in text


def test_strict_mode_fails_the_prolog(cluster: DevSlurm, image: Path) -> None:
    cluster.configure("hooks", strict=True, failpoints=["image:raise"])
    job = cluster.sbatch(
        "-N1", "-w", "n4", f"--bootseer-image={image}", script="#!/bin/sh\necho ran\n"
    )
    try:
        state = cluster.wait(job)
        # Slurm's answer to a failed Prolog: the job does not run, the node drains.
        assert state != "COMPLETED"
        assert "exit=1" in "\n".join(cluster.job_log_lines("n4", job))
        assert "drain" in cluster.node_states()["n4"]
    finally:
        subprocess.run(["scancel", str(job)], env=cluster.env, capture_output=True)


def test_noop_hook_runs_no_python(tmp_path: Path) -> None:
    """The no-bootseer path of the prolog is a shell test: no interpreter starts."""
    top = Path(__file__).resolve().parents[2]
    env = {"SLURM_JOB_ID": "1", "BOOTSEER_PYTHON": str(tmp_path / "must-not-run")}
    (tmp_path / "must-not-run").write_text("#!/bin/sh\ntouch ran\n")
    (tmp_path / "must-not-run").chmod(0o755)
    for hook in ("prolog/bootseer-prolog", "epilog/bootseer-epilog"):
        r = subprocess.run([str(top / hook)], env=env, cwd=tmp_path)
        assert r.returncode == 0
    assert not (tmp_path / "ran").exists()
    assert os.access(top / "prolog/bootseer-prolog", os.X_OK)
