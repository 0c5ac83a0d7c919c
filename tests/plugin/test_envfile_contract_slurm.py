"""The SPANK plugin and the hooks agree on the env file's contract, and a file the plugin
cannot use is said so, never passed over in silence.

New hooks with an older plugin (one that read the env file as the job's user, before it
became root's 0600) gave jobs no ``BOOTSEER_*`` variables and said nothing. The env file
now names its contract on its first line (``#bootseer-env 2``); a plugin of another
contract, or a file that is not root's, leaves the step without the variables and says
why in the job's stderr (the step's first task on the node) and in the slurmd log.
Real Slurm: the prolog writes the file, the test (root, as an admin's other install
would) changes it between two steps of one job."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bootseer import nodepaths
from tests.conftest import DevSlurm
from tests.waiting import wait_until

pytestmark = pytest.mark.slurm

COUNT = 'echo "{tag} vars=$(env | grep -c ^BOOTSEER_)"'


def _other_contract(env: Path) -> str:
    body = env.read_text().split("\n", 1)[1]
    env.write_text(f"{nodepaths.ENV_HEADER} {nodepaths.ENV_CONTRACT + 1}\n{body}")
    return f"written under contract {nodepaths.ENV_CONTRACT + 1}, this plugin reads contract "


def _before_the_contract(env: Path) -> str:
    env.write_text(env.read_text().split("\n", 1)[1])  # hooks that wrote no contract line
    return "written by bootseer hooks older than this plugin (no contract line)"


def _not_roots(env: Path) -> str:
    import pwd

    os.chown(env, pwd.getpwnam("alice").pw_uid, -1)
    return "not a file of root's, or writable by others: ignored"


def _fifo(env: Path) -> str:
    """A FIFO at the path: the plugin's open as root blocked, and the step with it."""
    env.unlink()
    os.mkfifo(env, 0o600)
    return "not a file of root's, or writable by others: ignored"


def _link(env: Path) -> str:
    """A link to another root-owned env file (another job's): it was followed, and that
    file's variables set in this job."""
    other = env.parent.parent / f".{env.parent.name}-other-env"
    other.write_text(f"{nodepaths.ENV_HEADER} {nodepaths.ENV_CONTRACT}\nBOOTSEER_OTHER=1\n")
    other.chmod(0o600)
    env.unlink()
    env.symlink_to(other)
    return "a symbolic link: ignored"


@pytest.mark.parametrize(
    "change", [_other_contract, _before_the_contract, _not_roots, _fifo, _link]
)
def test_a_step_whose_env_file_the_plugin_cannot_use_says_so(
    cluster: DevSlurm, base: Path, change: object
) -> None:
    node = cluster.nodes[1]
    go = base / f"go-{change.__name__}"  # type: ignore[attr-defined]
    script = (
        "#!/bin/sh\n"
        f"srun -N1 -n1 --export=NONE /bin/sh -c '{COUNT.format(tag='first')}'\n"
        "echo ready\n"
        f"i=0; while [ ! -e {go} ]; do i=$((i+1)); "
        '[ $i -gt 1200 ] && echo "no go" && exit 1; sleep 0.1; done\n'
        f"srun -N1 -n2 --export=NONE /bin/sh -c '{COUNT.format(tag='second')}'\n"
    )
    job = cluster.sbatch("-N1", "-n2", f"-w{node}", "--bootseer", script=script, user="alice")
    out = cluster.dir / "out" / f"{job}.out"
    env = nodepaths.job_env(cluster.dir / "nodes" / node / "run", job)
    try:
        wait_until(lambda: out.exists() and "ready" in out.read_text(), f"job {job} ready", 120)
        before = out.read_text()
        # The prolog's file, of this contract: the step has its variables, nothing said.
        assert "first vars=0" not in before and "first vars=" in before, before
        assert "bootseer:" not in before, before
        assert env.read_text().startswith(f"#bootseer-env {nodepaths.ENV_CONTRACT}\n")
        said = change(env)  # type: ignore[operator]
    finally:
        go.touch()
    assert cluster.wait(job, 120) == "COMPLETED", cluster.output(job)
    text = cluster.output(job)
    after = text.split("ready\n", 1)[1]
    assert after.count("second vars=0") == 2, text  # both tasks: nothing set (the steps
    # run with --export=NONE: what they have is what the plugin set)
    # Said once for the step on the node (its first task), naming the file and why.
    lines = [ln for ln in after.splitlines() if ln.startswith("bootseer:")]
    assert len(lines) == 1, text
    assert f"BOOTSEER_* variables not set: {env}: {said}" in lines[0], lines
    log = cluster.dir / "log" / f"slurmd-{node}.log"
    wait_until(lambda: said in log.read_text(errors="replace"), "the slurmd log says so", 30)
