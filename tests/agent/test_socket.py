"""The agent's socket is open to every user: what one user sends cannot hurt the agent
or reveal other users' jobs (issue 11). A real agent, no Slurm."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from bootseer.agentapi.client import AgentClient
from bootseer.agentapi.errors import AgentBadRequest, error_for
from bootseer.agentapi.jobs import Ping
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
    (for 10 s, again and again). Now 4 are accepted, the rest answered "busy" at once;
    bob still gets 2 (the total is 6), and root (the prolog) is never refused."""
    with running_agent(base, max_connections=6, max_connections_per_user=4) as agent:
        assert agent.proc is not None
        before = threads_of(agent.proc.pid)
        mallory = as_user(MALLORY, hold(agent.socket, 200))
        bob = None
        try:
            assert busy_answers(agent, mallory) == 196
            # Mallory's 4 accepted connections are idle: they hold no thread (each held
            # one for 10 s before); root's ping started the pool's first worker.
            assert threads_of(agent.proc.pid) - before <= 1
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


def tasks(pid: int) -> set[int]:
    return {int(t) for t in os.listdir(f"/proc/{pid}/task")}


def test_requests_are_answered_by_a_few_threads_kept(base: Path) -> None:
    """A thread was started for every connection, and a connection made for every request:
    a checkpoint daemon asking for its units one by one made the agent start and end a
    thread per unit (768 for 768 in slurm-dev/bench/p2p/via.py). Now a bounded pool of
    threads, kept, answers one-shot callers (an earlier client) and kept connections
    alike. The agent's threads are listed after every answer: a thread started for it is
    still ending then, often enough to be seen."""
    with running_agent(base) as agent:
        assert agent.proc is not None
        pid = agent.proc.pid
        assert agent.client.call("ping")["ok"]
        before = tasks(pid)
        seen = set(before)
        for _ in range(150):  # a caller of before: a connection per request
            assert raw_call(agent.socket, encode({"op": "ping"}))["ok"]
            seen |= tasks(pid)
        assert len(seen - before) <= 2, f"{len(seen - before)} threads for 150 requests"
        kept = AgentClient(agent.socket, keep=8)
        for _ in range(150):
            assert kept.ask(Ping()).pid == pid
            seen |= tasks(pid)
        assert kept.connects == 1

        def many() -> None:
            for _ in range(30):
                assert kept.ask(Ping()).pid == pid

        askers = [threading.Thread(target=many) for _ in range(8)]
        for t in askers:
            t.start()
        while any(t.is_alive() for t in askers):
            seen |= tasks(pid)
        for t in askers:
            t.join()
        # At most one worker per request at once (8), whatever the number of requests.
        assert len(seen - before) <= 10, f"{len(seen - before)} threads for 390 requests"
        assert kept.connects <= 8
        kept.close()


def test_idle_connections_hold_no_thread_and_stop_no_one(base: Path) -> None:
    """100 connections of root's (never refused) open and idle, half of them with a
    request begun and never ended: each held a thread of the agent's before (for its
    10 s); now they wait in the selector. A user and root are served meanwhile, and
    the agent gains at most the one worker their requests need."""
    with running_agent(base) as agent:
        assert agent.proc is not None
        pid = agent.proc.pid
        assert agent.client.call("ping")["ok"]
        before = tasks(pid)
        held = []
        try:
            for i in range(100):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                held.append(s)
                s.connect(str(agent.socket))
                if i % 2:
                    s.sendall(b'{"op": "pi')
            # Served after all of them were accepted (the backlog is taken in order).
            assert agent.client.call("ping", timeout=30)["ok"]
            code = (
                "from bootseer.agentapi.client import AgentClient\n"
                f"print(AgentClient({str(agent.socket)!r}).call('ping')['ok'])\n"
            )
            out, err = as_user(BOB, code).communicate(timeout=60)
            assert out.strip() == "True", err
            assert len(tasks(pid) - before) <= 1
        finally:
            for s in held:
                s.close()
