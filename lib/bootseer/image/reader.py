"""Serving an image's bytes to a job: from the block cache, or fetched on demand.

Every read is recorded in the job's trace (the blocks it touches, in order) and
tells the fetcher a job is reading, so the background fill keeps out of its way. A
read of several missing blocks asks for all of them at once: they arrive in parallel.

    >>> reader = ImageReader(cache, fetcher)  # doctest: +SKIP
    >>> reader.read(view, 0, 4)  # doctest: +SKIP
    b'hsqs'
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

from bootseer.image.blocks import block_range
from bootseer.image.cache import BlockCache
from bootseer.image.fetch import DEMAND, BlockSource, Fetcher
from bootseer.image.manifest import Manifest
from bootseer.image.trace import Recorder


class ReadImage(Protocol):
    """The image a job reads: its blocks, and where they come from."""

    @property
    def manifest(self) -> Manifest: ...

    @property
    def source(self) -> BlockSource: ...


class ReadingJob(Protocol):
    """What a read needs of the job (the node agent's :class:`bootseer.agent.jobs.JobView`):
    its image, and the trace its reads go to."""

    @property
    def image(self) -> ReadImage: ...

    @property
    def recorder(self) -> Recorder: ...


class ImageReader:
    def __init__(self, cache: BlockCache, fetcher: Fetcher) -> None:
        self.cache = cache
        self.fetcher = fetcher
        # Blocks the jobs' reads found in the cache, and those they waited for (metrics).
        self.hits = 0
        self.misses = 0
        self._count = threading.Lock()

    def read(
        self, view: ReadingJob, offset: int, size: int, cached_only: bool = False
    ) -> bytes | None:
        """Bytes of the job's image; with ``cached_only``, None unless all are local.

        Without ``cached_only`` it waits for the fetcher, and raises
        :class:`~bootseer.image.fetch.FetchError` when a block does not come in time.
        """
        m = view.image.manifest
        if offset >= m.size or size <= 0:
            return b""
        size = min(size, m.size - offset)
        blocks = block_range(offset, size, m.block_size)
        view.recorder.record(blocks.start, blocks.stop - 1)
        self.fetcher.last_read = time.monotonic()
        if not cached_only and len(blocks) > 1:
            for i in blocks:
                if m.blocks[i] not in self.cache:
                    self.fetcher.request(view.image.source, m, i, DEMAND)
        parts = []
        hits = misses = 0
        for i in blocks:
            start = i * m.block_size
            lo = max(offset, start) - start
            hi = min(offset + size, start + m.block_length(i)) - start
            data = self.cache.read(m.blocks[i], lo, hi - lo)
            if data is None:
                if cached_only:
                    return None
                misses += 1
                data = self.fetcher.get(view.image.source, m, i)[lo:hi]
            else:
                hits += 1
            parts.append(data)
        with self._count:
            self.hits += hits
            self.misses += misses
        return parts[0] if len(parts) == 1 else b"".join(parts)
