"""A located piece for root's own parts (a checkpoint unit, a snapshot frame): the agent
passes its cache file, opened, with the CRCs it recorded on verifying the piece, so
neither side reads or hashes the bytes twice (issue 19, the per-piece path)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer.agentapi.jobs import FetchPiece
from bootseer.config import SiteConfig
from bootseer.directio import read_fd
from bootseer.p2p.via import Via, agent_via
from tests.imagekit import AgentProc, running_agent, site_config

KEY = "deps/alice/snap/data"
PIECE = 1 << 20


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[AgentProc, list[str]]]:
    """An agent whose store holds KEY: three pieces of random bytes; their digests."""
    (tmp_path / "store" / KEY).parent.mkdir(parents=True)
    pieces = [os.urandom(PIECE) for _ in range(3)]
    (tmp_path / "store" / KEY).write_bytes(b"".join(pieces))
    with running_agent(tmp_path) as a:
        yield a, [hashlib.sha256(p).hexdigest() for p in pieces]


def _via(base: Path, log: list[str]) -> Via:
    cfg = SiteConfig.from_mapping(site_config(base)).for_node("t1")
    via = agent_via(cfg, 7, ("t1", "t1"), log=log.append, owner=(0, ""))
    assert via is not None
    return via


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_the_agent_passes_the_open_cache_file_and_its_crcs(
    agent: tuple[AgentProc, list[str]], tmp_path: Path
) -> None:
    a, shas = agent
    assert a.proc is not None
    req = FetchPiece(7, "t1,t1", KEY, 0, PIECE, shas[0], uid=0, pass_file=True)
    for source in ("store", "cache"):  # fetched and verified now, then a cache hit
        piece, fds = a.client.ask_for_fds(req)
        try:
            assert (piece.source, piece.passed, len(fds)) == (source, True, 1)
            assert len(piece.crcs) == PIECE // (32 << 10)
            assert hashlib.sha256(read_fd(fds[0])).hexdigest() == shas[0]
        finally:
            for fd in fds:
                os.close(fd)
    # The agent keeps no descriptor of the replies it sent.
    before = _fds(a.proc.pid)
    for _ in range(20):
        _, fds = a.client.ask_for_fds(req)
        for fd in fds:
            os.close(fd)
    assert _fds(a.proc.pid) <= before
    # Without the ask (a caller from before), the reply names the file and passes nothing.
    old = FetchPiece(7, "t1,t1", KEY, 0, PIECE, shas[0], uid=0)
    piece, fds = a.client.ask_for_fds(old)
    assert (piece.passed, piece.crcs, fds) == (False, (), [])


def test_via_serves_the_piece_and_refuses_a_damaged_cache_file(
    agent: tuple[AgentProc, list[str]], tmp_path: Path
) -> None:
    """A flipped byte in the agent's cache file: the CRCs catch it on the caller's side,
    which asks again; the agent's own read drops the block and fetches it afresh."""
    a, shas = agent
    log: list[str] = []
    via = _via(tmp_path, log)
    want = (tmp_path / "store" / KEY).read_bytes()[PIECE : 2 * PIECE]
    got = via("", KEY, PIECE, PIECE, shas[1])
    assert got is not None and bytes(got[0]) == want and got[1] == "store"
    cached = next((tmp_path / "t1" / "cache" / "image" / "blocks").rglob(shas[1]))
    with open(cached, "r+b") as f:
        f.seek(PIECE // 2)
        f.write(bytes([want[PIECE // 2] ^ 0xFF]))
    got = via("", KEY, PIECE, PIECE, shas[1])
    assert got is not None and bytes(got[0]) == want
    assert any("the agent's cache file is damaged" in line for line in log), log
    assert "damaged on disk" in a.log_text()
    assert cached.read_bytes() == want  # fetched again into the cache
