"""Who a node asks for a piece: its parent in the piece's tree, so every holder serves.

A piece's owner (:mod:`.owner`, index ``r`` in the job's node list) is the root of a
binomial tree over the job's nodes. Node ``i`` has the *label* ``y = (i - r) mod N``;
its parent has the label ``y`` with its highest set bit cleared, so its parent is node
``i - 2^h mod N``. A piece therefore reaches all N nodes in at most ``ceil(log2 N)``
hops, each node receiving it once and sending it on to its children (the labels
``y + 2^j`` for ``2^j > y``): ``(N-1)/N`` copies per node on average over the pieces,
``ceil(log2 N)`` at most for the pieces it owns, where the owner alone used to send
N - 1. Whatever the root, a node's parents and children are the nodes ``i +- 2^j``: at
most ``2 ceil(log2 N)`` peers per node (16 at 256 nodes, 28 at 10,000), the same few
for every piece, so connections are set up once per job and kept, never churned.

Labels only decrease towards the root, so a chain of relays never waits on itself; a
node whose parent is down asks its parent's parent, and so on up to the owner::

    >>> parent(5, 0, 8), parent(1, 0, 8), parent(0, 0, 8)
    (1, 0, None)
    >>> ancestors(7, 3, 8)  # label 4: its parent is the root, node 3
    [3]
    >>> sorted(peers(0, 8))
    [1, 2, 4, 6, 7]
"""

from __future__ import annotations


def label(i: int, root: int, n: int) -> int:
    return (i - root) % n


def parent(i: int, root: int, n: int) -> int | None:
    """Node ``i``'s parent in the tree rooted at ``root``; None for the root itself."""
    y = label(i, root, n)
    if y == 0:
        return None
    return (i - (1 << (y.bit_length() - 1))) % n


def ancestors(i: int, root: int, n: int) -> list[int]:
    """Node ``i``'s parent, its parent's parent, ..., the root last ([] for the root)."""
    chain = []
    p = parent(i, root, n)
    while p is not None:
        chain.append(p)
        p = parent(p, root, n)
    return chain


def children(i: int, root: int, n: int) -> list[int]:
    """The nodes that ask node ``i`` for a piece of the tree rooted at ``root``."""
    y = label(i, root, n)
    out = []
    step = 1 << y.bit_length()  # 2^j > y (for the root: every 2^j)
    while y + step < n:
        out.append((i + step) % n)
        step <<= 1
    return out


def cousins(i: int, root: int, n: int) -> list[int]:
    """Node ``i``'s tree peers that get the piece at its parent's depth: the labels
    ``y - 2^j`` for the bits ``j`` of ``y`` below its highest (each a lower label than
    ``i``'s, so asking one never makes a cycle). Asked when the parent is slow::

        >>> cousins(7, 0, 8), parent(5, 0, 8), parent(6, 0, 8), parent(7, 0, 8)
        ([5, 6], 1, 2, 3)
    """
    y = label(i, root, n)
    out = []
    j = y.bit_length() - 2
    while j >= 0:
        if y >> j & 1:
            out.append((i - (1 << j)) % n)
        j -= 1
    return out


def peers(i: int, n: int) -> set[int]:
    """Every node ``i`` may ever ask or be asked by, whatever the piece: ``i +- 2^j``."""
    out = set()
    step = 1
    while step < n:
        out.add((i + step) % n)
        out.add((i - step) % n)
        step <<= 1
    out.discard(i)
    return out
