"""The agent restarts in place (an upgrade) only when no job uses it, and leaves no stale
mount: real FUSE, real squashfs images, the agent as a process (no Slurm needed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer.agent.handler import Caller
from bootseer.agentapi.errors import AgentError, AgentRefused
from bootseer.agentapi.jobs import AgentRestart, Ping, PingReply, Stats
from tests.imagekit import AgentProc, add_image, make_squashfs, running_agent
from tests.waiting import wait_until

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("mksquashfs") or not os.path.exists("/dev/fuse"),
        reason="needs root, /dev/fuse and squashfs-tools",
    ),
]


@pytest.fixture
def image(base: Path) -> Path:
    return make_squashfs(base / "img.sqsh", {"bin/tool": 300_000, "lib/x.so": 700_000})


def mounts_at(path: Path) -> int:
    with open("/proc/self/mountinfo") as f:
        return sum(1 for line in f if line.split()[4] == str(path))


def restarted(agent: AgentProc, before: PingReply) -> PingReply | None:
    try:
        now = agent.client.ask(Ping(), timeout=5)
    except AgentError:
        return None
    return now if now.started != before.started else None


def test_a_restart_waits_for_the_jobs_then_runs_again_in_place(base: Path, image: Path) -> None:
    add_image(base, image, "test:1")
    original = image.read_bytes()
    with running_agent(base) as agent:
        assert agent.proc is not None
        pid = agent.proc.pid
        lazy = Path(agent.prepare(1, "test:1")["path"])
        assert lazy.read_bytes() == original
        before = agent.client.ask(Ping())
        assert before.pid == pid and before.prefix == os.path.realpath(sys.prefix)

        now = agent.client.ask(AgentRestart(False))
        assert (now.state, now.jobs) == ("busy", [1])
        # A bootseer job between its prolog and epilog (its job dir) holds it too.
        (base / "t1" / "run" / "jobs" / "7").mkdir(parents=True)
        pending = agent.client.ask(AgentRestart(True))
        assert (pending.state, pending.jobs) == ("pending", [1, 7])
        assert lazy.read_bytes() == original  # the job's image is still served
        agent.release(1)
        assert agent.client.ask(Ping()).started == before.started  # job 7 still runs
        (base / "t1" / "run" / "jobs" / "7").rmdir()

        after = wait_until(lambda: restarted(agent, before), "the agent restarted", 60)
        assert after is not None and after.pid == pid  # the same process
        assert agent.proc.poll() is None
        assert mounts_at(agent.mount) == 1  # its new mount, none stale beneath
        again = Path(agent.prepare(2, "test:1")["path"])
        assert again.read_bytes() == original
        agent.release(2)
        assert "restarting: no job uses the agent" in agent.log_text()


def test_requests_sent_during_the_restart_wait_for_the_new_agent(base: Path) -> None:
    with running_agent(base) as agent:
        before = agent.client.ask(Ping())
        sock = os.stat(agent.socket).st_ino
        assert agent.client.ask(AgentRestart(False)).state == "restarting"
        # The old agent accepts nothing more; its listening socket passes to the new
        # program, so this ping waits in the backlog instead of finding no agent.
        now = agent.client.ask(Ping(), timeout=60)
        assert now.started != before.started and now.pid == before.pid
        assert os.stat(agent.socket).st_ino == sock  # the very socket, never re-bound
        assert mounts_at(agent.mount) == 1


def test_bootseer_agent_restart_restarts_only_an_agent_of_another_install(base: Path) -> None:
    with running_agent(base) as agent:
        cmd = [sys.executable, "-m", "bootseer.cli", "agent", "--restart", "--node", "t1"]

        def run(*extra: str) -> dict[str, object]:
            r = subprocess.run(
                [*cmd, *extra, "--json"], env=agent.env, capture_output=True, text=True, timeout=180
            )
            assert r.returncode == 0, r.stderr
            doc: dict[str, object] = json.loads(r.stdout)
            return doc

        before = agent.client.ask(Ping())
        assert run()["state"] == "current"  # it runs this very venv: nothing to do
        assert agent.client.ask(Ping()).started == before.started
        done = run("--force")  # a new config: restart all the same
        assert done["state"] == "restarted" and done["prefix"] == os.path.realpath(sys.prefix)
        assert agent.client.ask(Ping()).started != before.started


def test_only_root_may_restart_the_agent(base: Path) -> None:
    from bootseer.agent.handler import handle

    with pytest.raises(AgentRefused):
        handle(None, AgentRestart(), Caller(1000))  # type: ignore[arg-type]


def test_doctor_names_an_agent_that_runs_an_older_install(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bootseer.doctor import Node
    from bootseer.doctor.agent import check_agent

    with running_agent(base) as agent:
        monkeypatch.setenv("BOOTSEER_CONFIG", str(agent.config_path))
        node = Node.here("t1")
        assert check_agent(node).status == "ok"
        # This bootseer is a newer install than the agent's (the venv link switched).
        monkeypatch.setattr(sys, "prefix", str(base / "venvs" / "new"))
        check = check_agent(node)
        assert check.status == "problem", check
        assert f"the agent runs {agent.client.ask(Ping()).prefix}" in check.detail
        assert "an older install" in check.detail and "--restart" in check.fix


def test_a_new_script_that_cannot_run_gives_the_same_program_again(tmp_path: Path) -> None:
    """The install's script names an interpreter that is gone: the agent runs again
    from its own venv (the install keeps it), with its listening socket, rather than not at all."""
    broken = tmp_path / "bootseer"
    broken.write_text("#!/nonexistent/python3\n")
    broken.chmod(0o755)
    sock_path = tmp_path / "agent.sock"
    code = (
        "import os, socket, sys\n"
        "from pathlib import Path\n"
        "from bootseer.agent import handover\n"
        f"path = Path({str(sock_path)!r})\n"
        "again = handover.inherited(path)\n"
        "if again is not None:\n"
        "    print('again', again.getsockname())\n"
        "    sys.exit(0)\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "s.bind(str(path)); s.listen()\n"
        f"sys.argv[0] = {str(broken)!r}\n"
        "handover.exec_again(s)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"again {sock_path}\n"
    assert f"cannot run {broken} again" in r.stderr


def test_a_users_request_that_never_ends_does_not_hold_the_restart_back(base: Path) -> None:
    """mallory trickles a request in, a byte a second, never a whole line. Before, the
    agent's handler thread waited on it (each byte within its 10 s timeout) and the
    restart gave it handover.DRAIN seconds, then cut it off. Now the selector thread
    gathers her bytes and no worker waits on them: her connection is no request under
    way, the restart goes at once, and she is cut off once her request has not come
    whole within the agent's idle timeout."""
    trickle = (
        "import socket, sys, time\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "s.connect(sys.argv[1])\n"
        "print('connected', flush=True)\n"
        "for _ in range(120):\n"
        "    s.send(b' ')\n"
        "    time.sleep(1)\n"
    )
    with running_agent(base) as agent:
        before = agent.client.ask(Ping())
        as_mallory = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
        user = subprocess.Popen(
            [*as_mallory, "/usr/bin/python3", "-c", trickle, str(agent.socket)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert user.stdout is not None and user.stdout.readline() == "connected\n"
            # Accepted before this stats request (the backlog is served in order), and
            # not counted: only this one is under way.
            assert agent.client.ask(Stats()).connections == 1
            reply = agent.client.ask(AgentRestart(False), timeout=60)
            assert reply.state == "restarting", reply
            after = wait_until(lambda: restarted(agent, before), "the agent restarted", 60)
            assert after is not None and after.pid == before.pid
            assert "cut off" not in agent.log_text()
        finally:
            user.kill()
            user.wait()
