"""Fixed-size blocks of an image file, named by their content digest.

An image of ``size`` bytes is cut into ``ceil(size / block_size)`` blocks; every block
but the last is ``block_size`` long. A block is stored once in the store under its
SHA-256, however many images hold it::

    >>> block_key("ab" + "0" * 62)
    'images/blocks/ab/ab00000000000000000000000000000000000000000000000000000000000000'
    >>> list(block_range(0, 10, 4))  # blocks touched by a 10-byte read at 0
    [0, 1, 2]

The default block size (256 KiB, ``[image] block_size_kib``) was chosen by measurement
(docs/image.md): against 1 MiB it cut the bytes a PyTorch startup needs by a quarter
and the time to first step by a tenth or more; smaller blocks cost one store request
each, which per-request overhead and link latency make dear.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator

DEFAULT_BLOCK_SIZE = 256 << 10
MIN_BLOCK_SIZE = 64 << 10
MAX_BLOCK_SIZE = 64 << 20
# The most blocks one run (one request to a peer) names: 8 MiB of the smallest blocks.
MAX_RUN_BLOCKS = 128
DIGEST = re.compile(r"^[0-9a-f]{64}$")


def digest(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def block_key(block_digest: str) -> str:
    return f"images/blocks/{block_digest[:2]}/{block_digest}"


def block_count(size: int, block_size: int) -> int:
    return (size + block_size - 1) // block_size


def block_range(offset: int, length: int, block_size: int) -> range:
    """Indices of the blocks a read of ``length`` bytes at ``offset`` touches."""
    if length <= 0:
        return range(0)
    return range(offset // block_size, (offset + length - 1) // block_size + 1)


def check_block_size(block_size: int) -> int:
    if not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE or block_size & (block_size - 1):
        raise ValueError(
            f"block size {block_size} must be a power of two between "
            f"{MIN_BLOCK_SIZE >> 10} KiB and {MAX_BLOCK_SIZE >> 20} MiB"
        )
    return block_size


def cut(path: str, block_size: int) -> Iterator[tuple[int, bytes]]:
    """Yield ``(index, data)`` for each block of the file at ``path``, in order."""
    with open(path, "rb", buffering=0) as f:
        index = 0
        while True:
            data = f.read(block_size)
            while data and len(data) < block_size:  # a short read is not yet the end
                more = f.read(block_size - len(data))
                if not more:
                    break
                data += more
            if not data:
                return
            yield index, data
            index += 1
