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
import weakref
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


# How far past a sequential read the reader asks the kernel to read the cache's blocks
# ahead (BlockCache.advise): they lie in the cache's packs in the order they came (the
# trace's, the fill's, a peer's), not the image's, so the disk's own read-ahead reads
# the wrong bytes ahead as often as the right ones.
READ_AHEAD = 8 << 20
# A read that starts this close to where the job's last one ended reads on: the kernel's
# requests (up to 1 MiB) may come a little out of order, served by several threads.
NEAR = 2 << 20


class _Stream:
    """Where a job's last read ended, and how far its blocks were read ahead."""

    end = -1
    advised = 0  # blocks below this index were advised already


class ImageReader:
    def __init__(self, cache: BlockCache, fetcher: Fetcher) -> None:
        self.cache = cache
        self.fetcher = fetcher
        self._streams: weakref.WeakKeyDictionary[ReadingJob, _Stream] = weakref.WeakKeyDictionary()
        # Blocks the jobs' reads found in the cache, and those they waited for (metrics).
        self.hits = 0
        self.misses = 0
        # The reads that reached the agent (FUSE requests) and their bytes: a job's
        # re-read of pages the kernel still holds adds none.
        self.requests = 0
        self.bytes = 0
        self._count = threading.Lock()

    def read(self, view: ReadingJob, offset: int, size: int) -> bytearray:
        """Bytes of the job's image, waiting for the fetcher for blocks not local.

        The blocks' bytes go straight into one buffer (each block's part read and
        checked by :meth:`BlockCache.read_into`). Raises
        :class:`~bootseer.image.fetch.FetchError` when a block does not come in time.
        """
        m = view.image.manifest
        if offset >= m.size or size <= 0:
            with self._count:
                self.requests += 1
            return bytearray()
        size = min(size, m.size - offset)
        blocks = block_range(offset, size, m.block_size)
        view.recorder.record(blocks.start, blocks.stop - 1)
        self.fetcher.last_read = time.monotonic()
        if len(blocks) > 1:
            for i in blocks:
                if m.blocks[i] not in self.cache:
                    self.fetcher.request(view.image.source, m, i, DEMAND)
        self._read_ahead(view, offset, size, blocks)
        out = bytearray(size)
        buf = memoryview(out)
        hits = misses = 0
        for i in blocks:
            start = i * m.block_size
            lo = max(offset, start) - start
            hi = min(offset + size, start + m.block_length(i)) - start
            part = buf[start + lo - offset : start + hi - offset]
            # The reply goes into the job file's page cache: the cache's pages of it
            # are dropped, so the node's memory holds the image's bytes once, not twice.
            if self.cache.read_into(m.blocks[i], lo, part, drop=True):
                hits += 1
                continue
            misses += 1
            part[:] = memoryview(self.fetcher.get(view.image.source, m, i))[lo:hi]
        with self._count:
            self.hits += hits
            self.misses += misses
            self.requests += 1
            self.bytes += size
        return out

    def _read_ahead(self, view: ReadingJob, offset: int, size: int, blocks: range) -> None:
        """Start the disk reads of this request's blocks at once (they then overlap), and
        of the next ``READ_AHEAD`` bytes' when the job reads on from near where it stopped
        (the kernel's requests may come a little out of order)."""
        m = view.image.manifest
        with self._count:
            stream = self._streams.get(view)
            if stream is None:
                stream = self._streams[view] = _Stream()
            sequential = stream.end >= 0 and abs(offset - stream.end) <= NEAR
            if sequential:
                start = max(blocks.start, stream.advised)
                upto = min(m.nblocks, (offset + size + READ_AHEAD) // m.block_size + 1)
                stream.end = max(stream.end, offset + size)
            else:
                start, upto = blocks.start, blocks.stop
                stream.end = offset + size
            stream.advised = max(stream.advised, upto) if sequential else upto
        if upto - start > 1 or (sequential and upto > start):
            self.cache.advise(m.blocks[i] for i in range(start, upto))
