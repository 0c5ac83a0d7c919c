"""The agent's log stays bounded whatever anyone sends it (issue 21 item 5)."""

from __future__ import annotations

import socket
from pathlib import Path

from bootseer.agent.agentlog import BURST, MAX_LINE, AgentLog
from bootseer.linelog import LineLog
from bootseer.p2p.server import PeerServer, ServedJob
from bootseer.p2p.wire import Hello, PieceReply, PieceRequest, read_message

KEY = b"site-key-" + b"x" * 32
REFUSALS = 500


def refused_requests(port: int, n: int) -> None:
    """What anyone on any host can send port 746: requests with a bad proof."""
    for i in range(n):
        with socket.create_connection(("127.0.0.1", port)) as conn:
            Hello.decode(read_message(conn))
            conn.sendall(PieceRequest(42 + i, "0" * 64, "1" * 64, 1).encode())
            assert PieceReply.decode(read_message(conn)).error == "refused"


def test_a_flood_of_refused_peers_logs_a_few_lines_and_a_count(tmp_path: Path) -> None:
    path = tmp_path / "n1-agent.log"
    log = AgentLog(LineLog(path, "agent"))
    jobs: dict[int, ServedJob] = {}
    server = PeerServer(("127.0.0.1", 0), KEY, jobs.get, log)
    server.start()
    try:
        refused_requests(server.port, REFUSALS)
    finally:
        server.close()
    assert server.refused == REFUSALS
    log.flush(float("inf"))
    lines = path.read_text().splitlines()
    # Today every refusal is a line: 500 lines, ~42 KB/s per client on a real node.
    assert len(lines) == BURST + 1, lines[-3:]
    assert f"log: {REFUSALS - BURST} more lines like " in lines[-1]
    assert log.dropped == REFUSALS - BURST


def test_a_users_long_name_is_cut() -> None:
    lines: list[str] = []
    log = AgentLog(lines.append)
    log(f"ckpt door: uid 1001 ckpt_put mallory/x: {'n' * 100_000}: refused")
    assert len(lines[0]) < MAX_LINE + 100 and lines[0].endswith("characters cut)")


def test_the_file_is_rotated_past_its_cap(tmp_path: Path) -> None:
    path = tmp_path / "n1-agent.log"
    log = LineLog(path, "agent", max_bytes=10_000)
    for i in range(2_000):
        log(f"job={i} line {i}")
    assert path.stat().st_size <= 10_000 + 100
    assert path.with_name(path.name + ".1").stat().st_size <= 10_000 + 100
    assert "job=1999 line 1999" in path.read_text()
