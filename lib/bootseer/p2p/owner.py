"""Which node of a job owns a piece: the one that fetches it from the store for all.

A piece's name is a digest (BLAKE3 or SHA-256), already uniform, so its leading bits
taken modulo the job's node count spread pieces evenly and cost O(1) per piece, where
rendezvous hashing would hash the piece once per node (10^8 hashes for a 30 GB image on
1,000 nodes). The node list is fixed for a job's life; a node that fails is skipped by
the askers (they go to the store), so nothing ever needs to be remapped::

    >>> owner("0f" * 32, ("n1", "n2", "n3"))
    'n1'
"""

from __future__ import annotations

from collections.abc import Sequence

from bootseer.digest import encoded


def owner(piece: str, nodes: Sequence[str]) -> str:
    return nodes[owner_index(piece, len(nodes))]


def owner_index(piece: str, n: int) -> int:
    """The owner's index among a job's ``n`` nodes."""
    return int(encoded(piece)[:15], 16) % n
