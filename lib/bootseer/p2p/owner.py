"""Which node of a job owns a piece: the one that fetches it from the store for all.

A piece's name is a digest (BLAKE3 or SHA-256), already uniform, so its leading bits
taken modulo the job's node count spread pieces evenly and cost O(1) per piece, where
rendezvous hashing would hash the piece once per node (10^8 hashes for a 30 GB image on
1,000 nodes). The node list is fixed for a job's life; a node that fails is skipped by
the askers (they go to the store), so nothing ever needs to be remapped::

    >>> owner("0f" * 32, ("n1", "n2", "n3"))
    'n1'

An image's blocks are owned by *range* instead (:func:`range_owner_index`): the blocks
of each :data:`RANGE_BYTES` of the image have one owner, each range's by a digest of
the image's id and the range's number. A start reads a file's blocks together, and the
hot set's bundles (:mod:`bootseer.image.bundles`) hold them in that order, so the
blocks a node owns in a bundle are stretches of a range or more, each one ranged read,
where owners by digest left it every N-th block. The rule depends on the image's
manifest alone, so every node of a job agrees on it whatever traces and bundles it
read. Nodes that ask under another rule (an agent of an older version) are
served only what a node holds (:data:`TREES`): two rules could make two nodes each
wait on the other.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence

from bootseer.digest import encoded

# An image block's tree is its range's: RANGE_BYTES of the image (blocks of 256 KiB:
# 4). Ranges of 4 MiB (a bundle's size) made a reader crossing a slow owner's range wait
# on it 16 blocks in turn: with one of three nodes' links at 20 Mbit/s, the fast nodes
# read a 24 MiB image in 9.5-12.4 s, against 4.5-7.4 s with owners by digest and
# 3.6-11.9 s, median 5.0, with ranges of 1 MiB (tests/p2p/test_straggler_slurm.py).
RANGE_BYTES = 1 << 20
# The rule for image blocks a request says it was asked under (PieceRequest.trees);
# an asker that names another (or none: older versions, whose owners were by digest)
# is served only what the node holds.
TREES = "range-1MiB"


def owner(piece: str, nodes: Sequence[str]) -> str:
    return nodes[owner_index(piece, len(nodes))]


def owner_index(piece: str, n: int) -> int:
    """The owner's index among a job's ``n`` nodes."""
    return int(encoded(piece)[:15], 16) % n


def range_owner_index(image_id: str, index: int, block_size: int, n: int) -> int:
    """The owner's index among a job's ``n`` nodes of block ``index`` of image
    ``image_id``: that of its range of :data:`RANGE_BYTES`, by the SHA-256 of the
    image's id and the range's number. Uniform, as a block's digest is: ranges taken
    in turn round the nodes would root the hot set's trees at a few hundred adjacent
    nodes of a 10,000-node job, and the nodes just past them, low in every tree's
    labels, would send each range on several times (bootseer.p2p.tree)::

        >>> [range_owner_index("0f" * 32, i, 256 << 10, 1000) for i in (0, 3, 4)]
        [609, 609, 668]
    """
    per_range = max(1, RANGE_BYTES // max(1, block_size))
    return _range_owner_index(image_id, index // per_range, n)


@functools.lru_cache(maxsize=1 << 16)
def _range_owner_index(image_id: str, range_no: int, n: int) -> int:
    """Once per range: a job's prefetch and fill ask for each of its blocks."""
    return owner_index(hashlib.sha256(f"{image_id}/{range_no}".encode()).hexdigest(), n)
