"""The agent's socket is open to every user: what one user sends cannot hurt the agent
or reveal other users' jobs (issue 11). A real agent, no Slurm."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bootseer.agentapi.errors import AgentBadRequest, error_for
from bootseer.agentapi.wire import encode
from tests.imagekit import AgentProc, add_image, make_squashfs, running_agent
from tests.waiting import wait_until

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("mksquashfs") or not os.path.exists("/dev/fuse"),
        reason="needs root, /dev/fuse and squashfs-tools",
    ),
]


ALICE, BOB, MALLORY = 4242, 4343, 4444


def raw_call(path: Path, line: bytes) -> Any:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(path))
        s.sendall(line)
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            buf += chunk
    return json.loads(buf)


def test_a_deeply_nested_request_is_a_bad_request(base: Path) -> None:
    with running_agent(base) as agent:
        answer = raw_call(agent.socket, b"[" * 30_000 + b"]" * 30_000 + b"\n")
        assert isinstance(error_for(answer.get("kind"), ""), AgentBadRequest), answer
        assert "deeper than" in answer["error"]
        assert agent.client.call("ping")["ok"]
        assert raw_call(agent.socket, encode({"op": "ping"}))["ok"]


def as_user(uid: int, code: str, **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            sys.executable,
            "-c",
            code,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        **kw,
    )


def test_stats_shows_a_user_only_their_own_jobs(base: Path) -> None:
    image = make_squashfs(base / "img.sqsh", {"x": 300_000})
    add_image(base, image, "test:1")
    with running_agent(base) as agent:
        agent.prepare(5, "test:1", uid=ALICE, gid=ALICE)
        agent.prepare(6, "test:1", uid=BOB, gid=BOB)
        code = (
            "import json; from bootseer.agentapi.client import AgentClient\n"
            f"print(json.dumps(AgentClient({str(agent.socket)!r}).call('stats')['jobs']))\n"
        )
        seen = {}
        for uid in (ALICE, BOB, MALLORY):
            out, err = as_user(uid, code).communicate(timeout=30)
            seen[uid] = json.loads(out or err)
        assert seen == {ALICE: [5], BOB: [6], MALLORY: []}
        assert agent.stats()["jobs"] == [5, 6]  # root (the admin) sees the node's jobs
        agent.release(5)
        agent.release(6)


def hold(path: Path, n: int) -> str:
    """A program that opens ``n`` connections, says "connected", and once a line comes on
    its stdin, how many were answered busy; it holds them open until its stdin closes."""
    return HOLD.replace("PATH", repr(str(path))).replace("COUNT", str(n))


HOLD = """
import socket, sys
path, n = PATH, COUNT
held, refused = [], 0
for _ in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    held.append(s)
print("connected", flush=True)
sys.stdin.readline()
for s in held:
    s.setblocking(False)
    try:
        if b"busy" in s.recv(4096):
            refused += 1
    except BlockingIOError:
        pass
print(refused, flush=True)
sys.stdin.read()
"""


def busy_answers(agent: AgentProc, holder: subprocess.Popen[str]) -> int:
    """How many of the ``hold`` program's connections the agent answered busy. The agent
    accepts connections in order and answers busy before it accepts the next: once root's
    ping, connected after all of them, is answered, every one was served or refused."""
    assert holder.stdout is not None and holder.stdin is not None
    line = holder.stdout.readline()
    assert line == "connected\n", line + (holder.stderr.read() if holder.stderr else "")
    assert agent.client.call("ping", timeout=30)["ok"]
    holder.stdin.write("\n")
    holder.stdin.flush()
    return int(holder.stdout.readline())


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads: line")


def test_connections_are_capped_per_user_and_in_total(base: Path) -> None:
    """Mallory opens 200 idle connections: each used to hold one of the agent's threads
    (for 10 s, again and again). Now 4 are served, the rest answered "busy" at once;
    bob still gets 2 (the total is 6), and root (the prolog) is never refused."""
    with running_agent(base, max_connections=6, max_connections_per_user=4) as agent:
        assert agent.proc is not None
        before = threads_of(agent.proc.pid)
        mallory = as_user(MALLORY, hold(agent.socket, 200))
        bob = None
        try:
            assert busy_answers(agent, mallory) == 196
            # Mallory's 4 served connections hold a thread each (for the handler's 10 s
            # idle timeout); root's ping held one more until its handler returned, which
            # under load can be after the answer arrived: the count settles, well within
            # the 10 s the refused connections would have held their threads before.
            pid = agent.proc.pid
            wait_until(lambda: threads_of(pid) - before <= 4, "4 threads for mallory", timeout=5)
            bob = as_user(BOB, hold(agent.socket, 4))
            assert busy_answers(agent, bob) == 2
            assert agent.client.call("ping", timeout=5)["ok"]  # root: never refused
        finally:
            for p in (mallory, bob):
                if p is not None:
                    p.kill()
                    p.wait()
        # Once they are closed, users are served again: as soon as the agent has seen
        # them closed (its threads end on EOF), so asked until then, with a deadline.
        code = (
            "from bootseer.agentapi.client import AgentClient\n"
            f"print(AgentClient({str(agent.socket)!r}).call('ping')['ok'])\n"
        )
        wait_until(
            lambda: as_user(BOB, code).communicate(timeout=30)[0].strip() == "True",
            "bob served again",
        )
