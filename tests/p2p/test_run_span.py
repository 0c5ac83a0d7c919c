"""Runs stay near the readers: a peer that gives few blocks gets short runs, not far ones."""

from __future__ import annotations

import concurrent.futures as cf
import hashlib

from bootseer.image.manifest import Manifest
from bootseer.image.prefetch import RUN_SPAN, request_blocks

BS = 4096
BLOCKS = 128


class Peers:
    """A source whose block ``i`` comes from ``near`` for every 8th block (a node's nearest
    parent in a job's trees gives 1/N of them), from ``far`` otherwise."""

    def __init__(self, digests: list[str]) -> None:
        self.peer = {d: ("near" if i % 8 == 0 else "far") for i, d in enumerate(digests)}

    def run_peer(self, digest: str) -> str | None:
        return self.peer[digest]

    def read_run(self, *args: object) -> None:
        raise AssertionError("not read here")

    def read_block(self, *args: object) -> bytes:
        raise AssertionError("not read here")

    def describe(self) -> str:
        return "peers"


class Asked:
    """A fetcher that notes the runs it is asked for."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, list[int]]] = []

    def request_run(self, runs, peer, manifest, blocks, priority, interest, ahead=False):  # type: ignore[no-untyped-def]
        self.runs.append((peer, list(blocks)))
        return [cf.Future() for _ in blocks]

    def request(self, source, manifest, index, priority, interest, ahead=False):  # type: ignore[no-untyped-def]
        raise AssertionError("every block here is a peer's")


def test_a_run_of_a_peer_that_gives_few_blocks_stays_within_two_runs_of_blocks() -> None:
    """Runs of up to 4 blocks: the far peer's runs are full and 4-5 blocks long in the
    order; the near peer's (every 8th block) hold one block each, where unbounded they
    held 4 blocks 32 apart, and waited for the last before any came."""
    digests = [hashlib.sha256(b"%d" % i).hexdigest() for i in range(BLOCKS)]
    manifest = Manifest(BLOCKS * BS, BS, tuple(digests))
    asked = Asked()
    futures = request_blocks(asked, Peers(digests), manifest, range(BLOCKS), 1, 4 * BS)  # type: ignore[arg-type]
    assert sorted(futures.values()) == list(range(BLOCKS))
    for peer, run in asked.runs:
        assert len(run) <= 4
        assert run[-1] - run[0] < RUN_SPAN * 4, (peer, run)
    near = [run for peer, run in asked.runs if peer == "near"]
    assert len(near) == BLOCKS // 8 and all(len(run) == 1 for run in near)
    far = [run for peer, run in asked.runs if peer == "far"]
    assert sum(len(run) == 4 for run in far) >= len(far) - 1
