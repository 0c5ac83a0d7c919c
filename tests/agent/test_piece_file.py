"""A located piece for root's own parts (a checkpoint unit, a snapshot frame): the agent
passes its cache file, opened, with the CRCs it recorded on verifying the piece, so
neither side reads or hashes the bytes twice (issue 19, the per-piece path)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer import digest
from bootseer.agentapi.client import AgentClient
from bootseer.agentapi.jobs import FetchPiece
from bootseer.config import SiteConfig
from bootseer.context import expand_nodes, fold_nodes
from bootseer.directio import read_fd
from bootseer.p2p.owner import owner, owner_index
from bootseer.p2p.via import Via, agent_via
from tests.imagekit import AgentProc, running_agent, site_config
from tests.waiting import wait_until

KEY = "deps/alice/snap/data"
PIECE = 1 << 20


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[AgentProc, list[str]]]:
    """An agent whose store holds KEY: three pieces of random bytes; their digests
    (BLAKE3, what a snapshot captured now names its frames by)."""
    (tmp_path / "store" / KEY).parent.mkdir(parents=True)
    pieces = [os.urandom(PIECE) for _ in range(3)]
    (tmp_path / "store" / KEY).write_bytes(b"".join(pieces))
    with running_agent(tmp_path) as a:
        yield a, [digest.of(p) for p in pieces]


def _via(base: Path, log: list[str]) -> Via:
    cfg = SiteConfig.from_mapping(site_config(base)).for_node("t1")
    via = agent_via(cfg, 7, ("t1", "t1"), log=log.append, owner=(0, ""))
    assert via is not None
    return via


def _packs_open(pid: int) -> list[str]:
    """The cache's pack files process ``pid`` holds open (its own: a pack's, its index's;
    and any it passed and has not closed yet)."""
    held = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:  # closed meanwhile
            continue
        if "/packs/" in target:
            held.append(target)
    return held


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
            assert piece.offset is not None and piece.offset % 4096 == 0
            data = read_fd(fds[0], None, piece.offset, PIECE)
            assert digest.matches(data, shas[0])
        finally:
            for fd in fds:
                os.close(fd)
    # Root's parts keep their connection (issue 19: none made per piece): every piece
    # on it, each with its own descriptor; the agent keeps none of those it passed
    # (closed once sent): only its own (a pack's, its index's, the pack's written past
    # the page cache) of the one pack the three pieces went to.
    kept = AgentClient(a.socket, keep=1)
    for _ in range(20):
        for i, sha in enumerate(shas):
            ask = FetchPiece(7, "t1,t1", KEY, i * PIECE, PIECE, sha, uid=0, pass_file=True)
            piece, fds = kept.ask_for_fds(ask)
            try:
                assert (piece.passed, len(fds)) == (True, 1)
                data = read_fd(fds[0], None, piece.offset or 0, PIECE)
                assert digest.matches(data, sha)
            finally:
                for fd in fds:
                    os.close(fd)
    assert kept.connects == 1
    kept.close()
    pid = a.proc.pid
    wait_until(lambda: len(_packs_open(pid)) <= 3, "the agent closes the files it passed")
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
    cached, at = _find_in_packs(tmp_path / "t1" / "cache" / "image" / "packs", want)
    with open(cached, "r+b") as f:
        f.seek(at + PIECE // 2)
        f.write(bytes([want[PIECE // 2] ^ 0xFF]))
    got = via("", KEY, PIECE, PIECE, shas[1])
    assert got is not None and bytes(got[0]) == want
    assert any("the agent's cache file is damaged" in line for line in log), log
    assert "damaged on disk" in a.log_text()
    _find_in_packs(tmp_path / "t1" / "cache" / "image" / "packs", want)  # fetched again


def test_via_serves_a_frame_named_by_sha256_and_sends_a_refused_ask_to_the_store(
    agent: tuple[AgentProc, list[str]], tmp_path: Path
) -> None:
    """A snapshot captured before BLAKE3 names its frames by SHA-256: the agent fetches,
    checks and caches them as before. A request the agent refuses (here a digest of an
    unknown hash; likewise a new prolog's ``digest`` at an agent of the release before,
    which wants ``sha256``) sends the caller to the store, never fails its restore."""
    log: list[str] = []
    via = _via(tmp_path, log)
    want = (tmp_path / "store" / KEY).read_bytes()[2 * PIECE : 3 * PIECE]
    old = hashlib.sha256(want).hexdigest()
    for source in ("store", "cache"):
        got = via("", KEY, 2 * PIECE, PIECE, old)
        assert got is not None and bytes(got[0]) == want and got[1] == source
    assert via("", KEY, 2 * PIECE, PIECE, "blake4:" + old) is None
    assert any("from the store" in line and "digest" in line for line in log), log


def _find_in_packs(packs: Path, want: bytes) -> tuple[Path, int]:
    """The pack holding ``want`` and its offset there (the agent's own, a process apart)."""
    for p in sorted(packs.glob("*.pack")):
        at = p.read_bytes().find(want)
        if at >= 0:
            return p, at
    raise AssertionError(f"no pack under {packs} holds the piece")


def test_a_piece_of_a_ten_thousand_node_job(
    agent: tuple[AgentProc, list[str]], tmp_path: Path
) -> None:
    """The request names the job's nodes folded (``a[00000-04320],t1,z[...]``): one by
    one, 10,000 names passed the agent's 64 KiB request line and every piece went to the
    store. The nodes are named so that this node (t1) owns the piece: no peer is asked."""
    _, shas = agent
    n = 10_000
    k = owner_index(shas[2], n)  # t1's place in the job's node order
    nodes = (*(f"a{i:05d}" for i in range(k)), "t1", *(f"z{i:05d}" for i in range(n - 1 - k)))
    assert expand_nodes(fold_nodes(nodes)) == nodes and owner(shas[2], nodes) == "t1"
    log: list[str] = []
    cfg = SiteConfig.from_mapping(site_config(tmp_path)).for_node("t1")
    via = agent_via(cfg, 8, nodes, log=log.append, owner=(0, ""))
    assert via is not None
    want = (tmp_path / "store" / KEY).read_bytes()[2 * PIECE :]
    for _ in range(3):  # the node list expanded once, then from the agent's memory
        got = via("", KEY, 2 * PIECE, PIECE, shas[2])
        assert got is not None, log
        assert bytes(got[0]) == want
    assert log == []
