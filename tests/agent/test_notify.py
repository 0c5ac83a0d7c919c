"""The agent tells systemd when it serves (the unit bootseer install writes is Type=notify)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from bootseer.sdnotify import notify
from tests.imagekit import AgentProc, site_config

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.skipif(
        os.geteuid() != 0 or not os.path.exists("/dev/fuse"), reason="needs root and /dev/fuse"
    ),
]


def test_notify_reaches_an_abstract_socket() -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(f"\0bootseer-notify-test-{os.getpid()}")
        assert notify("READY=1", env={"NOTIFY_SOCKET": f"@bootseer-notify-test-{os.getpid()}"})
        assert s.recv(64) == b"READY=1"


def test_the_agent_says_ready_once_its_socket_answers(base: Path) -> None:
    agent = AgentProc(base, "t1", site_config(base))
    path = base / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(str(path))
        s.settimeout(30)
        agent.env["NOTIFY_SOCKET"] = str(path)
        try:
            agent.start()
            assert s.recv(64) == b"READY=1"
            assert agent.client.call("ping", timeout=5) is not None
        finally:
            agent.stop()
