"""SIGTERM stops the agent whatever its threads are doing: a store read that never
returns (here a FIFO no one writes, in a file store) must not keep the process alive
after it has unmounted and said "agent stopped" (16-node startup bench, session 11:
3 of 16 agents outlived their SIGTERM; the interpreter joined pool threads at exit)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from pathlib import Path

from bootseer.agentapi.errors import AgentError
from bootseer.agentapi.jobs import FetchPiece
from tests.imagekit import running_agent
from tests.waiting import wait_until

KEY = "deps/alice/snap/data"
FIFO_OPEN = ("fifo_open", "wait_for_partner")  # where open(2) of a FIFO sleeps


def test_a_stopped_agent_exits_while_a_store_read_hangs(tmp_path: Path) -> None:
    fifo = tmp_path / "store" / KEY
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)  # opening it for reading blocks until a writer comes: none will
    with running_agent(tmp_path) as a:
        assert a.proc is not None
        proc = a.proc

        def ask() -> None:  # through the hedge: its store read runs in a pool thread
            with contextlib.suppress(AgentError, OSError):  # the agent stops under it
                a.client.ask(FetchPiece(7, "t1,t2", KEY, 0, 4096, "ab" * 32, uid=0), timeout=300)

        threading.Thread(target=ask, daemon=True).start()
        wait_until(lambda: _waits_on_fifo(proc.pid), "a store read held on the FIFO", timeout=60)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)  # a loaded node unmounts and stops in seconds
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the agent outlived SIGTERM by 60 s; its log: {a.log.read_text()[-1500:]}"
            ) from None
        assert "agent stopped" in a.log.read_text()


def _waits_on_fifo(pid: int) -> bool:
    """Whether a thread of ``pid`` sleeps in the kernel opening a FIFO."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            if Path(f"/proc/{pid}/task/{tid}/wchan").read_text() in FIFO_OPEN:
                return True
        except OSError:  # the thread ended meanwhile
            continue
    return False
