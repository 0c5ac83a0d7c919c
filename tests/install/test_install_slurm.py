"""Issue 13's "done when", end to end: ``bootseer install`` onto four slurm-dev nodes
reached over SSH (slurm-dev/up --install-over-ssh), ``bootseer doctor NODESET`` clean on
all of them over SSH, then jobs of an ordinary user that use all three techniques with
the nodes' own install (venvs on the nodes' /usr/bin/python3)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer.agentapi.client import AgentClient
from bootseer.agentapi.errors import AgentError
from bootseer.agentapi.jobs import Ping, PingReply, Stats
from tests.conftest import TEST_PORT_BASE, TEST_STATE, DevSlurm, devcluster, own_cluster, squash
from tests.waiting import wait_until

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        not shutil.which("slurmctld") or not Path("/usr/sbin/sshd").exists(),
        reason="needs Debian's Slurm and openssh-server (scripts/bootstrap)",
    ),
]

NODE_ROOT = devcluster.NODE_ROOT
BOOTSEER = NODE_ROOT / "bin" / "bootseer"  # the link install puts on the nodes

JOB = f"""#!/bin/sh
set -e
export PATH={NODE_ROOT}/bin:$PATH
echo "bootseer=$(readlink -f "$(command -v bootseer)")"
echo "image=$(head -c 4 "$BOOTSEER_IMAGE")"
bootseer deps run -- sh -c 'mkdir -p "$BOOTSEER_DEPS_PREFIX/lib" &&
    echo installed > "$BOOTSEER_DEPS_PREFIX/lib/dep.txt"'
echo "deps=$(cat "$BOOTSEER_DEPS_PREFIX/lib/dep.txt")"
if [ -f "$BOOTSEER_CKPT/run/model.txt" ]; then
  echo "ckpt loaded $(cat "$BOOTSEER_CKPT/run/model.txt")"
else
  mkdir -p "$BOOTSEER_CKPT/run" && echo weights-1 > "$BOOTSEER_CKPT/run/model.txt"
  echo "ckpt saved"
fi
"""


@pytest.fixture(scope="module")
def installed() -> Iterator[DevSlurm]:
    settings = devcluster.Settings(
        f"{TEST_STATE}-sshinstall", nodes=4, port_base=TEST_PORT_BASE + 120, ssh_install=True
    )
    with own_cluster(settings) as cluster:
        yield DevSlurm(cluster)


@pytest.fixture
def work() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="bootseer-install-job-", dir="/var/tmp"))
    d.chmod(0o755)
    src = d / "src"
    src.mkdir()
    (src / "hello").write_text("hello from the image\n")
    squash(src, d / "hello.sqsh")
    (d / "req.txt").write_text("dep==1\n")
    (d / "req.txt").chmod(0o644)
    try:
        yield d
    finally:
        shutil.rmtree(d)


def test_doctor_is_clean_on_every_installed_node(installed: DevSlurm) -> None:
    ssh = installed.cluster.ssh
    here = Path(sys.executable).parent / "bootseer"
    remote = devcluster.INSTALL_PREFIX / "venv" / "bin" / "bootseer"  # each node's own
    r = subprocess.run(
        [
            str(here),
            "doctor",
            "n[1-4]",
            "--rsh",
            f"ssh -F {ssh.config}",
            "--remote-bootseer",
            str(remote),
        ],
        env=installed.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "ok   n[1-4]: every check passed"
    # Each node's hooks and agent run on the node's own /usr/bin/python3 (Debian's 3.11.2
    # here: restores use bootseer's copy of tarfile's data filter).
    debian = subprocess.run(
        ["/usr/bin/python3", "-c", "import sys; print(sys.version)"],
        capture_output=True,
        text=True,
    ).stdout
    python = devcluster.INSTALL_PREFIX / "venv" / "bin" / "python3"
    for node in installed.nodes:
        on = subprocess.run(
            ["ssh", "-F", str(ssh.config), node, f"{python} -c 'import sys; print(sys.version)'"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert on.stdout == debian, on.stderr


def test_a_users_jobs_use_all_three_techniques(installed: DevSlurm, work: Path) -> None:
    prefix = devcluster.NODE_LOCAL / "install-env"
    args = [
        f"--bootseer-image={work}/hello.sqsh",
        f"--bootseer-deps={prefix},key={work}/req.txt",
        "--bootseer-ckpt=install/run",
    ]
    first = installed.sbatch("-w", "n1", *args, script=JOB)
    assert installed.wait(first) == "COMPLETED", installed.output(first)
    second = installed.sbatch("-w", "n3", *args, script=JOB)
    assert installed.wait(second) == "COMPLETED", installed.output(second)

    out = installed.output(second)
    assert f"bootseer={devcluster.INSTALL_PREFIX}/venvs/" in out  # the node's own venv
    assert "image=hsqs" in out
    assert "deps=installed" in out
    assert "ckpt loaded weights-1" in out
    text = "\n".join(installed.job_log_lines("n3", second))
    for step in ("image", "deps", "ckpt"):
        assert f"prolog step={step} outcome=ok" in text, text
    assert "restored" in text  # the first run's snapshot, on another node


def agent(cluster: devcluster.Cluster, node: str) -> AgentClient:
    return AgentClient(cluster.dir / "nodes" / node / "run" / "agent.sock")


def mounts_at(path: Path) -> int:
    with open("/proc/self/mountinfo") as f:
        return sum(1 for line in f if line.split()[4] == str(path))


def restarted(cluster: devcluster.Cluster, node: str, before: PingReply) -> bool:
    try:
        return agent(cluster, node).ask(Ping(), timeout=5).started != before.started
    except AgentError:
        return False


def test_restart_agents_restarts_idle_agents_and_waits_for_running_jobs(
    installed: DevSlurm, work: Path
) -> None:
    """An upgrade (here: a new config) with a job running on n1: n2-n4's agents run the
    new install at once, n1's once the job ended; none leaves a mount behind."""
    cluster = installed.cluster
    before = {n: agent(cluster, n).ask(Ping()) for n in installed.nodes}
    go = work / "go"
    script = (
        "#!/bin/sh\n"
        'head -c 4 "$BOOTSEER_IMAGE"; echo\n'
        f"while [ ! -e {go} ]; do sleep 0.2; done\n"  # the job runs until the test says
        'head -c 4 "$BOOTSEER_IMAGE"; echo\n'
    )
    job = installed.sbatch("-w", "n1", f"--bootseer-image={work}/hello.sqsh", script=script)
    wait_until(
        lambda: job in agent(cluster, "n1").ask(Stats()).jobs, "n1's agent serves the job", 120
    )

    upgraded = work / "config.toml"
    upgraded.write_text(cluster.site_config.read_text() + "# upgraded\n")
    lines = cluster.install_over_ssh(upgraded).splitlines()
    assert any(
        re.fullmatch(rf"n1: installed: .*\(agent restarts once jobs {job} end\)", x) for x in lines
    ), lines
    assert any(re.fullmatch(r"n\[2-4\]: installed: .*\(agent restarted\)", x) for x in lines)
    for node in ("n2", "n3", "n4"):
        now = agent(cluster, node).ask(Ping())
        assert now.started != before[node].started and now.pid == before[node].pid
        assert mounts_at(cluster.dir / "nodes" / node / "images") == 1
    assert agent(cluster, "n1").ask(Ping()).started == before["n1"].started  # the job's agent

    go.touch()
    assert installed.wait(job) == "COMPLETED", installed.output(job)
    assert installed.output(job).split() == ["hsqs", "hsqs"]  # its image, read to the end
    wait_until(lambda: restarted(cluster, "n1", before["n1"]), "n1's agent restarted", 120)
    assert mounts_at(cluster.dir / "nodes" / "n1" / "images") == 1

    # Back to the site's config; no job runs: every agent restarts at once.
    lines = cluster.install_over_ssh().splitlines()
    assert any(re.fullmatch(r"n\[1-4\]: installed: .*\(agent restarted\)", x) for x in lines)
    read = '#!/bin/sh\nhead -c 4 "$BOOTSEER_IMAGE"\n'
    again = installed.sbatch("-w", "n1", f"--bootseer-image={work}/hello.sqsh", script=read)
    assert installed.wait(again) == "COMPLETED", installed.output(again)
    assert installed.output(again) == "hsqs"
