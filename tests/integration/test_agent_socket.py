"""The agent's socket is open to every user: what one user sends cannot hurt the agent
or reveal other users' jobs (issue 11). A real agent, no Slurm."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

from bootseer.image.protocol import AgentBadRequest, encode, error_for
from tests.imagekit import running_agent

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("mksquashfs") or not os.path.exists("/dev/fuse"),
    reason="needs root, /dev/fuse and squashfs-tools",
)


@pytest.fixture
def base(tmp_path: Path) -> Path:
    (tmp_path / "log").mkdir()
    for d in (tmp_path, *tmp_path.parents):
        if d == Path("/tmp"):
            break
        d.chmod(0o755)
    return tmp_path


def raw_call(path: Path, line: bytes) -> dict:  # type: ignore[type-arg]
    import json

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
    return json.loads(buf)  # type: ignore[no-any-return]


def test_a_deeply_nested_request_is_a_bad_request(base: Path) -> None:
    with running_agent(base) as agent:
        answer = raw_call(agent.socket, b"[" * 30_000 + b"]" * 30_000 + b"\n")
        assert isinstance(error_for(answer.get("kind"), ""), AgentBadRequest), answer
        assert "deeper than" in answer["error"]
        assert agent.client.call("ping")["ok"]
        assert raw_call(agent.socket, encode({"op": "ping"}))["ok"]
