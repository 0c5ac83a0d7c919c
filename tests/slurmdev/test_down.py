"""slurm-dev's ``down`` stops the agents it started, by pid file, start time and command
line, never by name alone: an agent restarted in place from its own venv's interpreter
(the install's script could not run) calls itself ``python3``. Real processes; no cluster."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import devcluster
import pytest
from daemons import ours, pid_alive, write_pidfile

from tests.conftest import TEST_PORT_BASE
from tests.waiting import wait_until

# The program the agent runs again when the install's script cannot run: the venv's
# interpreter with the same command line (agent/handover.py's exec_again).
FALLBACK = textwrap.dedent(
    """
    import os, sys, time
    if os.environ.pop("AGAIN", None):
        os.execve(sys.executable, sys.orig_argv, dict(os.environ))
    open(sys.argv[1] + ".ready", "w").close()
    time.sleep(600)
    """
)


@pytest.fixture
def cluster(tmp_path: Path) -> devcluster.Cluster:
    c = devcluster.Cluster(devcluster.Settings(str(tmp_path / "state"), nodes=1))
    c.run.mkdir(parents=True)
    return c


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:  # whatever the test left running
        if p.poll() is None:
            p.kill()
            p.wait()


def agent_like(
    tmp_path: Path, started: list[subprocess.Popen[bytes]], *args: str, again: bool
) -> subprocess.Popen[bytes]:
    """A process as slurm-dev starts an agent: its venv's ``bootseer`` script (comm
    ``bootseer``), ``agent --node n1``; with ``again``, it then runs itself again through
    the interpreter, as the agent's fallback does (comm ``python3``)."""
    script = tmp_path / "bootseer"
    script.write_text(f"#!{sys.executable}\n{FALLBACK}")
    script.chmod(0o755)
    ready = tmp_path / "agent"
    env = {"AGAIN": "1"} if again else {}
    proc = subprocess.Popen([str(script), str(ready), *args], env=env)
    started.append(proc)
    wait_until(lambda: Path(f"{ready}.ready").exists(), "the process ran", 30)
    return proc


def comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def test_down_stops_an_agent_that_now_calls_itself_python3(
    cluster: devcluster.Cluster, tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    proc = agent_like(tmp_path, started, "agent", "--node", "n1", again=True)
    pidfile = cluster.pidfiles()["bootseer-agent-n1"]
    write_pidfile(pidfile, proc.pid)
    assert comm(proc.pid).startswith("python")  # what the name check missed (python3, or
    # python where the suite runs under that name)
    assert cluster.alive("bootseer-agent-n1") == proc.pid

    cluster.stop_daemons()
    assert proc.wait(timeout=60) is not None
    assert not pidfile.exists()


def test_down_leaves_a_process_that_took_over_the_pid(
    cluster: devcluster.Cluster, tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    """The pid file is stale: its pid is another process now (a reused pid), though its
    command line and name look like an agent's."""
    proc = agent_like(tmp_path, started, "agent", "--node", "n1", again=False)
    pidfile = cluster.pidfiles()["bootseer-agent-n1"]
    start = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    pidfile.write_text(f"{proc.pid} {int(start) - 1}\n")  # started before this process
    assert cluster.alive("bootseer-agent-n1") is None
    cluster.stop_daemons()
    assert pid_alive(proc.pid) and proc.poll() is None
    assert not pidfile.exists()


def test_a_process_of_another_command_line_is_not_taken_for_the_agent(
    cluster: devcluster.Cluster, tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    other = agent_like(tmp_path, started, "agent", "--node", "n2", again=True)
    pidfile = cluster.pidfiles()["bootseer-agent-n1"]
    write_pidfile(pidfile, other.pid)
    assert ours(pidfile, ("agent", "--node", "n2")) == other.pid
    assert cluster.alive("bootseer-agent-n1") is None  # n2's, not n1's
    pidfile.write_text(f"{other.pid}\n")  # no start time recorded: the command line decides
    assert cluster.alive("bootseer-agent-n1") is None
    cluster.stop_daemons()
    assert other.poll() is None


@pytest.mark.root
@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/usr/sbin/sshd"), reason="needs root and sshd"
)
def test_an_sshd_that_rewrote_its_title_is_still_found(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    """sshd's listener shows 'sshd: /usr/sbin/sshd -D -e -f CFG [listener] ...' as one
    argument: slurm-dev's per-node sshd (sshd.py) must still be found, and stopped."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "hk")], check=True
    )
    cfg = tmp_path / "sshd_config"
    port = TEST_PORT_BASE + 99  # of this checkout's reserved range (conftest)
    cfg.write_text(f"ListenAddress 127.0.0.1:{port}\nHostKey {tmp_path / 'hk'}\nPidFile none\n")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    proc = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-e", "-f", str(cfg)],
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    started.append(proc)
    pidfile = tmp_path / "sshd.pid"
    write_pidfile(pidfile, proc.pid)
    wait_until(
        lambda: "[listener]" in Path(f"/proc/{proc.pid}/cmdline").read_text(errors="replace"),
        "sshd's listener title",
        30,
    )
    assert ours(pidfile, ("sshd", "-D")) == proc.pid
