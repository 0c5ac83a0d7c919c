"""Every holder serves: a piece travels down its tree, relayed by the nodes that hold it.

The tree's shape (bounded peers, O(log N) depth, no cycles), then real peers on loopback:
a relay serves onward what it got from above, its bytes are verified, a relay that lies
is dropped for the next node up (or, with no honest node above, the store), outsiders
get nothing from any tier (owner, relay, a held piece's fast path, a rescue's
cached-only ask), and both ends keep their connections within the bound.
"""

from __future__ import annotations

import hashlib
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bootseer.p2p.auth import job_token, prove
from bootseer.p2p.client import PeerClient
from bootseer.p2p.owner import owner, owner_index
from bootseer.p2p.server import HeldPiece, PeerServer, ServedJob
from bootseer.p2p.swarm import Swarm
from bootseer.p2p.tree import ancestors, children, parent, peers
from bootseer.p2p.wire import Hello, PeerError, PieceReply, PieceRequest, read_message

KEY = b"site-key-" + b"t" * 32
JOB = 77
LOOPBACK = frozenset({"127.0.0.1"})
TIMEOUT = 60.0  # far beyond any wait a test expects, loaded or not


# -- the tree's shape -----------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 5, 16, 17, 100, 256, 1000])
def test_every_node_reaches_the_root_in_log_n_hops_each_receiving_once(n: int) -> None:
    depth = math.ceil(math.log2(n))
    for root in {0, 1, n // 2, n - 1}:
        sends = [0] * n
        for i in range(n):
            chain = ancestors(i, root, n)
            assert (chain[-1] if chain else i) == root
            assert len(chain) <= depth and len(set(chain)) == len(chain)  # no cycle
            p = parent(i, root, n)
            if p is not None:
                sends[p] += 1
                assert i in children(p, root, n)
        assert sum(sends) == n - 1  # each node gets the piece once
        assert max(sends) <= depth and sends[root] == depth  # the owner: log2 N, not N-1


@pytest.mark.parametrize("n", [2, 16, 256, 10_000])
def test_a_node_has_the_same_few_peers_whatever_the_piece(n: int) -> None:
    bound = 2 * math.ceil(math.log2(n))
    assert bound <= 28  # even at 10,000 nodes: far below the 64 connections a node keeps
    for i in {0, 1, n // 3, n - 1}:
        mine = peers(i, n)
        assert len(mine) <= bound
        for root in range(0, n, max(1, n // 50)):
            p = parent(i, root, n)
            assert p is None or p in mine
            assert set(children(i, root, n)) <= mine


def test_pieces_spread_sending_over_all_nodes() -> None:
    """The benchmark's 272 pieces on 256 nodes: no node sends much more than its share."""
    n = 256
    digests = [hashlib.sha256(b"%d" % k).hexdigest() for k in range(272)]
    sends = [0] * n
    for d in digests:
        root = owner_index(d, n)
        for i in range(n):
            sends[i] += len(children(i, root, n))
    assert sum(sends) == 272 * (n - 1)
    assert max(sends) <= 3 * 272  # the busiest node: within 3x the piece set


# -- real peers on loopback -----------------------------------------------------------


@dataclass
class Node:
    """What the agent does around the peer code, in a few lines: a piece it holds it
    serves, one it lacks it gets first (from above in the tree, or the store)."""

    name: str
    nodes: tuple[str, ...]
    store: dict[str, bytes]
    lie: bool = False
    busy: float = 0.0  # seconds of other work before each answer (test_slow_relay.py)
    held: dict[str, bytes] = field(default_factory=dict)
    store_reads: int = 0
    server: PeerServer | None = None
    swarm: Swarm | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, piece: str) -> bytes:
        with self.lock:
            if piece in self.held:
                return self.held[piece]
            assert self.swarm is not None
            data = self.swarm.fetch(piece, 0)
            if data is None:
                self.store_reads += 1
                data = self.store[piece]
            self.held[piece] = data
            return data

    def intake(self) -> float | None:
        return self.swarm.rates.median() if self.swarm is not None else None

    def provide(self, req: PieceRequest, deadline: float) -> bytes:
        if req.piece not in self.store:
            raise PeerError("missing", "not a piece of the job")
        if self.busy:
            time.sleep(self.busy)  # the node's CPU elsewhere: its answer starts late
        data = self.get(req.piece)
        return bytes([data[0] ^ 1]) + data[1:] if self.lie else data


@pytest.fixture
def cluster() -> Iterator[Callable[..., dict[str, Node]]]:
    made: list[Node] = []

    def make(
        n: int,
        store: dict[str, bytes],
        lie: tuple[str, ...] = (),
        dead: tuple[str, ...] = (),
        addresses: frozenset[str] = LOOPBACK,
        max_connections: int = 64,
    ) -> dict[str, Node]:
        names = tuple(f"n{i + 1}" for i in range(n))
        nodes = {x: Node(x, names, store, lie=x in lie) for x in names}
        ports: dict[str, int] = {}
        for x, node in nodes.items():
            # Its intake told with each piece, as the agent does (test_slow_relay.py).
            job = ServedJob(addresses, node.provide, intake=node.intake)
            node.server = PeerServer(
                ("127.0.0.1", 0),
                KEY,
                lambda j, job=job: job if j == JOB else None,  # type: ignore[misc]
                lambda _: None,
                max_connections=max_connections,
            )
            ports[x] = node.server.port
            if x in dead:
                node.server.close()  # refused: a node whose agent is down
            else:
                node.server.start()
            made.append(node)
        for node in nodes.values():
            node.swarm = Swarm(
                JOB,
                node.name,
                names,
                job_token(KEY, JOB),
                lambda x: ("127.0.0.1", ports[x]),
                PeerClient(timeout=TIMEOUT, max_open=max_connections),
                lambda _: None,
                dead_for=TIMEOUT,
            )
        return nodes

    yield make
    for node in made:
        assert node.server is not None and node.swarm is not None
        node.server.close()
        node.swarm.client.close()


def piece_with_owner(nodes: tuple[str, ...], name: str) -> tuple[str, bytes]:
    while True:
        data = os.urandom(32 << 10)
        d = hashlib.sha256(data).hexdigest()
        if owner(d, nodes) == name:
            return d, data


NAMES4 = ("n1", "n2", "n3", "n4")


def test_a_holder_serves_onward_and_its_bytes_are_verified(
    cluster: Callable[..., dict[str, Node]],
) -> None:
    # Owner n1; n4 (label 3) asks n2 (label 1), which gets it from n1 and relays it.
    d, data = piece_with_owner(NAMES4, "n1")
    nodes = cluster(4, {d: data})
    assert nodes["n4"].swarm is not None and nodes["n4"].swarm.source(d) == "n2"
    assert nodes["n4"].get(d) == data
    assert nodes["n4"].swarm.stats.peer_bytes == len(data)
    n1, n2 = nodes["n1"].server, nodes["n2"].server
    assert n1 is not None and n2 is not None
    assert n2.served_pieces == 1 and n1.served_pieces == 1  # n1 sent it once, to n2
    for x in ("n2", "n3"):
        assert nodes[x].get(d) == data  # n2 holds it now; n3 asks n1
    assert n1.served_pieces == 2  # n1 sent it to its children only (n2, n3), not to n4
    assert sum(node.store_reads for node in nodes.values()) == 1  # the owner's, once


def test_a_relay_that_lies_is_dropped_and_the_piece_comes_from_above(
    cluster: Callable[..., dict[str, Node]],
) -> None:
    d, data = piece_with_owner(NAMES4, "n1")
    nodes = cluster(4, {d: data}, lie=("n2",))
    n4 = nodes["n4"]
    assert n4.get(d) == data  # n2's bad bytes refused; n1 asked next
    assert n4.swarm is not None and n4.swarm.stats.corrupt == 1
    assert "do not match" in n4.swarm.stats.dropped["n2"]
    assert n4.swarm.source(d) == "n1"  # n2 skipped from now on
    assert n4.store_reads == 0


def test_a_relay_that_lies_with_no_honest_node_above_the_piece_comes_from_the_store(
    cluster: Callable[..., dict[str, Node]],
) -> None:
    """n4's parent n2 and the owner above it both serve bad bytes: each is refused on
    receipt and dropped, and n4 reads the store; no bad byte is kept or passed on."""
    d, data = piece_with_owner(NAMES4, "n1")
    nodes = cluster(4, {d: data}, lie=("n1", "n2"))
    n4 = nodes["n4"]
    assert n4.get(d) == data and n4.held[d] == data
    assert n4.store_reads == 1
    assert n4.swarm is not None and n4.swarm.stats.corrupt == 2
    assert n4.swarm.stats.peer_bytes == 0
    assert all("do not match" in n4.swarm.stats.dropped[x] for x in ("n1", "n2"))


def test_with_every_node_above_down_the_piece_comes_from_the_store(
    cluster: Callable[..., dict[str, Node]],
) -> None:
    d, data = piece_with_owner(NAMES4, "n1")
    nodes = cluster(4, {d: data}, dead=("n1", "n2"))
    n4 = nodes["n4"]
    assert n4.get(d) == data
    assert n4.store_reads == 1
    assert n4.swarm is not None and set(n4.swarm.stats.dropped) == {"n1", "n2"}


def test_with_the_owner_down_its_first_child_reads_the_store_for_all(
    cluster: Callable[..., dict[str, Node]],
) -> None:
    """The owner's children do not each read the store: they ask its first child."""
    names = tuple(f"n{i + 1}" for i in range(8))
    d, data = piece_with_owner(names, "n1")
    nodes = cluster(8, {d: data}, dead=("n1",))
    for x in ("n2", "n3", "n5"):  # labels 1, 2, 4: the owner's children
        assert nodes[x].get(d) == data
    assert nodes["n2"].store_reads == 1
    assert nodes["n3"].store_reads == nodes["n5"].store_reads == 0
    assert all(nodes[x].get(d) == data for x in names[1:])
    assert sum(node.store_reads for node in nodes.values()) == 1


def test_a_node_outside_the_job_gets_nothing_from_a_relay(
    cluster: Callable[..., dict[str, Node]],
) -> None:
    d, data = piece_with_owner(NAMES4, "n1")
    nodes = cluster(4, {d: data})
    assert nodes["n4"].get(d) == data  # n2 now holds it, as a relay
    n2 = nodes["n2"].server
    assert n2 is not None
    client = PeerClient(timeout=10)
    before = n2.served_pieces
    for token in (job_token(KEY, JOB + 1), job_token(b"another site" * 3, JOB)):
        with pytest.raises(PeerError) as err:
            client.fetch(("127.0.0.1", n2.port), PieceRequest(JOB, "", d, 0), token)
        assert err.value.kind == "refused"
    assert n2.served_pieces == before and n2.refused == 2
    # Right token, wrong address: a relay checks the job's addresses as an owner does.
    other = cluster(4, {d: data}, addresses=frozenset({"127.0.0.2"}))
    o2 = other["n2"].server
    assert o2 is not None
    with pytest.raises(PeerError) as err:
        client.fetch(("127.0.0.1", o2.port), PieceRequest(JOB, "", d, 0), job_token(KEY, JOB))
    assert err.value.kind == "refused" and o2.served_pieces == 0
    assert other["n1"].server is not None and other["n1"].server.served_pieces == 0
    client.close()


def ask_from(source: str, port: int, req: PieceRequest, token: bytes) -> PieceReply:
    """One request, as the peer client sends it, from ``source`` (another loopback
    address: a host outside the job that holds the job's token)."""
    with socket.create_connection(("127.0.0.1", port), TIMEOUT, (source, 0)) as sock:
        nonce = Hello.decode(read_message(sock))
        proof = prove(token, nonce, req.job_id, req.piece)
        sock.sendall(PieceRequest(req.job_id, proof, req.piece, req.priority,
                                  cached_only=req.cached_only, tag=1).encode())  # fmt: skip
        return PieceReply.decode(read_message(sock))


def test_a_node_outside_the_job_gets_nothing_from_any_tier(tmp_path: Path) -> None:
    """A node serves a job's pieces by three ways: one it must get first (owner, relay:
    ``provide``), one it holds (the fast path: sendfile, once the job is known), and a
    rescue's cached-only ask. With the job already being served to its nodes, an asker
    with another job's token, another site's, or the job's own token from an address
    outside the job is refused on each way, and gets no byte."""
    got = os.urandom(32 << 10)
    held = os.urandom(32 << 10)
    d_got, d_held = hashlib.sha256(got).hexdigest(), hashlib.sha256(held).hexdigest()
    (tmp_path / d_held).write_bytes(held)
    provided: list[str] = []

    def provide(req: PieceRequest, deadline: float) -> bytes:
        provided.append(req.piece)
        return {d_got: got, d_held: held}[req.piece]

    def held_piece(req: PieceRequest) -> HeldPiece | None:
        return HeldPiece(tmp_path / d_held, len(held)) if req.piece == d_held else None

    job = ServedJob(LOOPBACK, provide, held_piece)
    server = PeerServer(("127.0.0.1", 0), KEY, {JOB: job}.get, lambda _: None)
    server.start()
    addr = ("127.0.0.1", server.port)
    member = PeerClient(timeout=TIMEOUT)
    try:
        token = job_token(KEY, JOB)
        assert member.fetch(addr, PieceRequest(JOB, "", d_got, 0), token) == got
        assert member.fetch(addr, PieceRequest(JOB, "", d_held, 0), token) == held
        assert provided == [d_got]  # the held piece went the fast way
        served, sent = server.served_pieces, server.served_bytes
        asks = [PieceRequest(JOB, "", d, 0, cached_only=c) for d in (d_got, d_held)
                for c in (False, True)]  # fmt: skip
        for bad in (job_token(KEY, JOB + 1), job_token(b"another site" * 3, JOB)):
            for req in asks:
                outsider = PeerClient(timeout=TIMEOUT)
                with pytest.raises(PeerError) as err:
                    outsider.fetch(addr, req, bad)
                assert err.value.kind == "refused"
                outsider.close()
        for req in asks:  # the right token, from outside the job's addresses
            reply = ask_from("127.0.0.2", server.port, req, token)
            assert reply.error == "refused" and reply.size == 0
        assert server.refused == 3 * len(asks)
        assert (server.served_pieces, server.served_bytes) == (served, sent)
        assert provided == [d_got]
    finally:
        member.close()
        server.close()


def test_connections_stay_within_the_bound_both_ways(
    cluster: Callable[..., dict[str, Node]],
) -> None:
    """Eight askers of one node that serves at most 2 at once, each keeping at most 2
    open: every one is served (the rest wait their turn, none is refused or dropped)."""
    names = tuple(f"n{i + 1}" for i in range(9))
    pieces = dict(piece_with_owner(names, "n1") for _ in range(6))
    nodes = cluster(9, pieces, max_connections=2)
    # Every piece owned by n1: its children ask it directly, the others through them.
    results: dict[str, bool] = {}

    def fetch_all(x: str) -> None:
        results[x] = all(nodes[x].get(d) == data for d, data in pieces.items())

    threads = [threading.Thread(target=fetch_all, args=(x,)) for x in names[1:]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=TIMEOUT)
    assert len(results) == 8 and all(results.values())
    for node in nodes.values():
        assert node.server is not None and node.swarm is not None
        assert node.server.most_active <= 2
        assert node.swarm.client.most_open <= 2
        assert node.swarm.stats.peer_failures == 0
    assert sum(node.store_reads for node in nodes.values()) == len(pieces)
