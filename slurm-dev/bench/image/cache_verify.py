"""What checking every block read from the node's disk cache costs (docs/image.md).

Warm reads (the block file in the page cache, as on a node that ran the image before):
``BlockCache.read`` of whole blocks and of 128 KiB pieces (FUSE's request size before
the agent raises read-ahead), and the hashes one could check with, per MiB.

    /opt/bootseer/venv/bin/python3 slurm-dev/bench/image/cache_verify.py
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "lib"))

from bootseer import digest as digests
from bootseer.image.blocks import digest
from bootseer.image.cache import BlockCache

MIB = 1 << 20


def per_mib(fn, nbytes: int, repeat: int) -> float:  # type: ignore[no-untyped-def]
    """Milliseconds per MiB, best of five runs."""
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, time.perf_counter() - t)
    return best / (repeat * nbytes / MIB) * 1e3


def main() -> None:
    block = 256 << 10
    data = os.urandom(MIB)
    print("hash of 1 MiB (ms/MiB):")
    for name, fn in [
        ("sha256", lambda: hashlib.sha256(data).digest()),
        ("blake3", lambda: digests.of(data)),
        ("blake2b-128", lambda: hashlib.blake2b(data, digest_size=16).digest()),
        ("crc32 (zlib)", lambda: zlib.crc32(data)),
    ]:
        print(f"  {name:14} {per_mib(fn, MIB, 50):.3f}")
    with tempfile.TemporaryDirectory() as d:
        cache = BlockCache(Path(d), cap_bytes=1 << 30)
        blocks = [os.urandom(block) for _ in range(64)]  # 16 MiB
        names = [digest(b) for b in blocks]
        for n, b in zip(names, blocks, strict=True):
            cache.put(n, b)

        def whole() -> None:
            for n in names:
                cache.read(n, 0, block)

        def pieces() -> None:
            for n in names:
                cache.read(n, 0, 128 << 10)
                cache.read(n, 128 << 10, 128 << 10)

        def raw() -> None:  # what a read cost before: open, pread, close
            for n in names:
                where = cache.locate(n)
                assert where is not None
                fd = os.open(where.path, os.O_RDONLY)
                os.pread(fd, block, where.offset)
                os.close(fd)

        total = len(names) * block
        print(f"BlockCache.read, warm, {block >> 10} KiB blocks (ms/MiB):")
        print(f"  unchecked pread (before)      {per_mib(raw, total, 10):.3f}")
        print(f"  whole blocks, checked         {per_mib(whole, total, 10):.3f}")
        print(f"  128 KiB pieces, checked       {per_mib(pieces, total, 10):.3f}")


if __name__ == "__main__":
    main()
