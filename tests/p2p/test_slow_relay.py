"""A relay on a slow link is asked around; a busy one is not.

A node times each piece's bytes from its reply's header to the last byte (the data
phase) and passes over a relay whose rate is under a quarter of its other peers' for
the next node up the piece's tree (issue 20: 5% of the nodes on a tenth of the link held
back their subtrees, 1.52-1.62x at 64 emulated nodes). Here the slow relay's link is
slowed for real: the kernel paces every connection its server accepts
(``SO_MAX_PACING_RATE`` on the listening socket, inherited by each accepted one).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import statistics
from collections.abc import Callable

import pytest

from bootseer.p2p.client import PeerClient
from bootseer.p2p.linkrate import LinkRates
from bootseer.p2p.owner import owner_index
from bootseer.p2p.swarm import Swarm
from bootseer.p2p.tree import ancestors, cousins, label, parent, peers
from bootseer.p2p.wire import PeerError, PieceReply
from tests.p2p.test_tree import JOB, Node, cluster  # noqa: F401 (the fixture)

SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)
NAMES8 = tuple(f"n{i}" for i in range(1, 9))
SIZE = 256 << 10  # a production image block: several segments even on loopback
# Bytes a second: a block's bytes take a second, 10-100x what loopback takes for them
# on this loaded machine (the rule's bound is 8x)
SLOW_RATE = 250_000


def pieces_rooted(roots: set[int], count: int) -> dict[str, bytes]:
    """``count`` random pieces whose owner (the tree's root) is one of ``roots``."""
    out: dict[str, bytes] = {}
    while len(out) < count:
        data = os.urandom(SIZE)
        d = hashlib.sha256(data).hexdigest()
        if owner_index(d, len(NAMES8)) in roots:
            out[d] = data
    return out


def test_a_slow_relays_child_gets_its_pieces_from_the_next_node_up(
    cluster: Callable[..., dict[str, Node]],  # noqa: F811
) -> None:
    # n8's parents: n7 (pieces rooted at n7), n6 (at n5, n6) and n4 (at n1-n4); pieces
    # rooted at n1 go n1 -> n2 -> n4 -> n8.
    via_n7 = pieces_rooted({6}, 4)
    via_n6 = pieces_rooted({4, 5}, 4)
    via_n4 = pieces_rooted({0}, 4)
    later = pieces_rooted({0}, 4)
    store = {**via_n7, **via_n6, **via_n4, **later}
    nodes = cluster(8, store)
    n4, n8 = nodes["n4"], nodes["n8"]
    assert n4.server is not None and n8.swarm is not None
    # n4's link: every connection its server accepts from now on is paced by the kernel.
    n4.server._sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, SLOW_RATE)
    for d in later:
        assert ancestors(7, 0, 8) == [3, 1, 0] and n8.swarm.source(d) == "n4"
    for d, data in {**via_n7, **via_n6, **via_n4}.items():
        assert n8.get(d) == data
    rates = n8.swarm.rates.known()
    assert set(rates) == {"n7", "n6", "n4"}
    assert n8.swarm.rates.slow("n4"), rates
    assert not n8.swarm.rates.slow("n7") and not n8.swarm.rates.slow("n6"), rates

    served = n4.server.served_pieces
    for d, data in later.items():
        assert n8.swarm.source(d) == "n2"  # n4's parent, which holds it before n4 does
        assert n8.get(d) == data  # verified on receipt, as from any node
    # n4 never sent them (it would have, at its pace, before): n2 did, got from n1.
    assert n4.server.served_pieces == served
    assert not set(later) & set(n4.held)
    assert n8.swarm.stats.peer_failures == 0 and not n8.swarm.stats.dropped  # not dropped
    assert sum(node.store_reads for node in nodes.values()) == len(store)  # once each


def test_a_busy_relay_whose_bytes_come_at_full_speed_is_not_slow(
    cluster: Callable[..., dict[str, Node]],  # noqa: F811
) -> None:
    # n4 takes its time to answer (a loaded node: its work, not a test's wait), but once
    # it answers its bytes come as fast as the others'.
    via_n7 = pieces_rooted({6}, 4)
    via_n6 = pieces_rooted({4, 5}, 4)
    via_n4 = pieces_rooted({0}, 5)
    store = {**via_n7, **via_n6, **via_n4}
    nodes = cluster(8, store)
    n4, n8 = nodes["n4"], nodes["n8"]
    assert n8.swarm is not None
    n4.busy = 0.3
    served = n4.server.served_pieces if n4.server is not None else 0
    for d, data in {**via_n7, **via_n6, **via_n4}.items():
        assert n8.get(d) == data
    assert n4.server is not None and n4.server.served_pieces - served == len(via_n4)
    assert not n8.swarm.rates.slow("n4"), n8.swarm.rates.known()
    last = next(iter(pieces_rooted({0}, 1)))
    assert n8.swarm.source(last) == "n4"  # still its parent


def test_a_node_whose_own_link_is_slow_finds_no_peer_slow() -> None:
    """Every peer's bytes come through this node's own link: alike, none slow."""
    rates = LinkRates(horizon=60.0)
    for k in range(8):
        for p, s in (("a", 1.0), ("b", 1.4), ("c", 2.2), ("d", 1.1)):
            rates.record(p, 65536, s * (1 + k % 3))
    assert not any(rates.slow(p) for p in "abcd")
    # Too few peers known: no median to be slow against.
    two = LinkRates(horizon=60.0)
    for _ in range(8):
        two.record("fast", 65536, 0.01)
        two.record("slow", 65536, 5.0)
    assert not two.slow("slow")


def test_what_was_measured_ages_out_and_the_peer_is_asked_again() -> None:
    rates = LinkRates(horizon=0.0)
    for _ in range(8):
        for p in ("a", "b", "c"):
            rates.record(p, 65536, 0.01)
        rates.record("slow", 65536, 5.0)
    assert not rates.slow("slow") and rates.known() == {}


def test_detours_around_slow_nodes_stay_within_one_a_tree_level() -> None:
    """Every parent of n64 slow (the nodes n64 - 2^j): past them it asks the nodes above,
    none of them its tree peers, at most ceil(log2 N) of them (a handshake each),
    whatever the pieces."""
    n = 64
    names = tuple(f"n{i}" for i in range(1, n + 1))
    swarm = Swarm(
        JOB,
        "n64",
        names,
        b"t" * 32,
        lambda x: ("127.0.0.1", 1),
        PeerClient(timeout=1.0),
        lambda _: None,
        dead_for=600.0,
    )
    slow = {names[63 - (1 << j)] for j in range(6)}
    for _ in range(8):
        for x in names[:-1]:
            swarm.rates.record(x, 65536, 1.0 if x in slow else 0.01)
    assert {x for x in names if swarm.rates.slow(x)} == slow
    mine = {names[i] for i in peers(63, n)}
    asked = set()
    for k in range(2000):
        src = swarm.source(hashlib.sha256(b"%d" % k).hexdigest())
        if src is not None:
            asked.add(src)
    detours = asked - mine
    assert len(detours) == math.ceil(math.log2(n))  # taken, and no more
    assert asked & slow  # past the detours: the slow parent still, not the store


def test_a_relay_whose_own_pieces_come_slowly_is_asked_around(
    cluster: Callable[..., dict[str, Node]],  # noqa: F811
) -> None:
    """n4 sends at full speed, but the links of n2 and n3, its parents for the pieces
    rooted at n1-n3, are slow: those reach it late, and it says so (its intake, told
    with each piece it sends). n8, whose own parents' links are fast, times n4's bytes
    fast and still asks around it."""
    warm = {d: x for root in range(8) for d, x in pieces_rooted({root}, 4).items()}
    # n8's own: from n7 (rooted at n7), n6 (at n5, n6), n4 (at n1-n3)
    fresh = {**pieces_rooted({6}, 4), **pieces_rooted({4, 5}, 4), **pieces_rooted({0, 1, 2}, 4)}
    later = pieces_rooted({0}, 3)
    nodes = cluster(8, {**warm, **fresh, **later})
    n4, n8 = nodes["n4"], nodes["n8"]
    assert n4.swarm is not None and n8.swarm is not None and n4.server is not None
    for x in ("n2", "n3"):
        server = nodes[x].server
        assert server is not None
        server._sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, 8 * SLOW_RATE)
    for node in nodes.values():  # every node gets these, timing its parents
        for d, data in warm.items():
            assert node.get(d) == data
    for d, data in fresh.items():  # n8's parents tell their intakes, now known
        assert n8.get(d) == data
    # n4 times n2 and n3 slow (its intake, their median, is theirs); n8 times n4 fast
    # but hears its intake, under a quarter of its other parents' (n6, n7).
    intake = n4.swarm.rates.median()
    rates = n4.swarm.rates.known()
    assert intake is not None and intake * 4 < rates["n8"], rates
    sends = n8.swarm.rates.rate("n4")
    timed = n8.swarm.rates.known().values()
    assert sends is not None and 8 * sends >= statistics.median(timed)  # not slow by it
    assert n8.swarm.rates.slow("n4"), (intake, n8.swarm.rates.known())
    served = n4.server.served_pieces
    for d, data in later.items():
        # a node above n4 (n2 itself timed slow already, then n1): both hold it first
        assert n8.swarm.source(d) in ("n2", "n1")
        assert n8.get(d) == data
    assert n4.server.served_pieces == served  # asked around, not dropped
    assert not n8.swarm.stats.dropped


def test_a_nodes_cousins_hold_the_piece_at_its_parents_depth_and_make_no_cycle() -> None:
    for n in (8, 17, 64, 1000):
        for root in (0, 1, n // 2, n - 1):
            for i in range(0, n, max(1, n // 100)):
                y = label(i, root, n)
                p = parent(i, root, n)
                depth = len(ancestors(p, root, n)) if p is not None else None
                for c in cousins(i, root, n):
                    assert c in peers(i, n)  # a connection the tree opens anyway
                    assert label(c, root, n) < y  # asked only downwards: no cycle
                    assert len(ancestors(c, root, n)) == depth


def test_an_intake_is_told_only_when_known_and_bounded_when_read() -> None:
    assert b"intake" not in PieceReply(size=5).encode()  # a server of old reads the same
    told = json.loads(PieceReply(size=5, intake=123).encode()[4:])
    assert PieceReply.decode(told).intake == 123
    assert PieceReply.decode({"size": 5, "error": "", "message": ""}).intake == 0
    for bad in (-1, 2**53, "fast"):
        with pytest.raises(PeerError) as err:
            PieceReply.decode({"size": 5, "error": "", "message": "", "intake": bad})
        assert err.value.kind == "protocol"
