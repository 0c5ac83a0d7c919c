"""Fixed-size blocks of an image file, named by their content digest.

An image of ``size`` bytes is cut into ``ceil(size / block_size)`` blocks; every block
but the last is ``block_size`` long. A block is stored once in the store under its
digest (:mod:`bootseer.digest`), however many images hold it: a BLAKE3 one under
``blake3/``, as OCI lays out blobs by algorithm; a SHA-256 one (images added before
BLAKE3) where it always was::

    >>> block_key("ab" + "0" * 62)
    'images/blocks/ab/ab00000000000000000000000000000000000000000000000000000000000000'
    >>> block_key("blake3:cd" + "0" * 62)[:35]
    'images/blocks/blake3/cd/cd000000000'
    >>> key_digest(block_key("blake3:cd" + "0" * 62)) == "blake3:cd" + "0" * 62
    True
    >>> list(block_range(0, 10, 4))  # blocks touched by a 10-byte read at 0
    [0, 1, 2]

The default block size (256 KiB, ``[image] block_size_kib``) was chosen by measurement
(docs/image.md): against 1 MiB it cut the bytes a PyTorch startup needs by a quarter
and the time to first step by a tenth or more behind a 100 Mbit/s store link; smaller
blocks cost one store request each, which per-request overhead and link latency make
dear. Behind a 10 Gbit/s link at real sizes that cost turns the choice over: 1 MiB
blocks started a job a quarter sooner there (docs/image.md, "Block size").
"""

from __future__ import annotations

from collections.abc import Iterator

from bootseer import digest as digests

DEFAULT_BLOCK_SIZE = 256 << 10
MIN_BLOCK_SIZE = 64 << 10
MAX_BLOCK_SIZE = 64 << 20
# The most blocks one run (one request to a peer) names: 8 MiB of the smallest blocks.
MAX_RUN_BLOCKS = 128
BLOCKS = "images/blocks"  # the store's blocks, of every image


def digest(data: bytes | memoryview) -> str:
    """The digest a new block is named by."""
    return digests.of(data)


def block_key(block_digest: str) -> str:
    algorithm, hex_digits = digests.split(block_digest)
    if algorithm == "sha256":
        return f"{BLOCKS}/{hex_digits[:2]}/{hex_digits}"
    return f"{BLOCKS}/{algorithm}/{hex_digits[:2]}/{hex_digits}"


def key_digest(key: str) -> str | None:
    """The digest of the block at store key ``key`` (:func:`block_key`'s inverse), None
    if the key is not one a block is stored under."""
    parts = key.removeprefix(BLOCKS + "/").split("/")
    name = parts[-1] if len(parts) == 2 else f"{parts[0]}:{parts[-1]}"
    return name if digests.valid(name) and block_key(name) == key else None


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
