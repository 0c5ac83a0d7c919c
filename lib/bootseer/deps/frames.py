"""A stream cut into independent zstd frames, so several threads can decode it at once.

The archive object is the frames back to back: ``zstd -d`` and ``tar -I zstd`` read
it as one stream, and a restore fetches, verifies and decodes frames in parallel and
hands them on in order. Each frame records its uncompressed size in its header;
decoding checks it against the manifest before allocating anything, which is what
stops a decompression bomb.

    >>> import io
    >>> out = io.BytesIO()
    >>> frames = encode_stream(io.BytesIO(b"x" * 300_000).readinto, out.write,
    ...                        frame_bytes=1 << 17, level=3, threads=2)
    >>> [f.raw for f in frames]
    [131072, 131072, 37856]
    >>> b"".join(decode_frames(lambda off, n: out.getvalue()[off:off + n], frames, threads=2))[:3]
    b'xxx'
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence

from bootseer import digest as digests
from bootseer.deps.manifest import Frame
from bootseer.errors import ManifestError, describe


def default_threads(configured: int) -> int:
    return configured or min(8, os.cpu_count() or 1)


# Frames a restore has in flight when the site did not set ``[deps] threads``, whatever
# the node's cores: each worker fetches its frame (through the agent or from the store:
# waiting, not computing) before it decodes it. One per core left a 2-core node with two
# 8 MiB frames in flight: torch's 159 MiB snapshot restored in 10.9-12.7 s in a job, the
# extracting tar idle, against 6.4 s with eight (docs/performance.md).
FETCH_PARALLEL = 8


def restore_threads(configured: int) -> int:
    """A restore's workers: the site's ``[deps] threads``, else :data:`FETCH_PARALLEL`."""
    return configured or FETCH_PARALLEL


_local = threading.local()


def _compress(chunk: bytes, level: int) -> bytes:
    import zstandard

    cctx = getattr(_local, "cctx", None)
    if cctx is None or getattr(_local, "level", None) != level:
        cctx = _local.cctx = zstandard.ZstdCompressor(
            level=level, write_checksum=True, write_content_size=True
        )
        _local.level = level
    data: bytes = cctx.compress(chunk)
    return data


def _fill(readinto: Callable[[memoryview], int | None], size: int) -> bytes:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = readinto(view[got:])
        if not n:
            break
        got += n
    del view
    return bytes(buf[:got]) if got < size else bytes(buf)


def encode_stream(
    readinto: Callable[[memoryview], int | None],
    write: Callable[[bytes], object],
    *,
    frame_bytes: int,
    level: int,
    threads: int,
    progress: Callable[[int, int], None] | None = None,
) -> list[Frame]:
    """Read a stream to its end, write it as independent frames; return the frame list.

    ``progress(raw, stored)`` is called after each frame is written.
    """
    frames: list[Frame] = []
    offset = 0
    raw_total = 0
    window: deque[tuple[int, cf.Future[bytes]]] = deque()
    with cf.ThreadPoolExecutor(threads, thread_name_prefix="deps-encode") as pool:

        def flush_one() -> None:
            nonlocal offset, raw_total
            raw, fut = window.popleft()
            data = fut.result()
            write(data)
            frames.append(Frame(offset, len(data), raw, digests.of(data)))
            offset += len(data)
            raw_total += raw
            if progress:
                progress(raw_total, offset)

        while True:
            chunk = _fill(readinto, frame_bytes)
            if not chunk:
                break
            window.append((len(chunk), pool.submit(_compress, chunk, level)))
            if len(window) >= 2 * threads:
                flush_one()
            if len(chunk) < frame_bytes:
                break
        while window:
            flush_one()
    return frames


def decode_frame(data: bytes, frame: Frame, index: int, max_raw: int | None = None) -> bytes:
    """Verify one fetched frame against the manifest and decode it (no larger than
    ``max_raw``: the whole frame is held in memory)."""
    import zstandard

    if max_raw is not None and frame.raw > max_raw:
        raise ManifestError(
            f"frame {index}: unpacks to {frame.raw} bytes, more than deps.max_frame_bytes={max_raw}"
        )
    if len(data) != frame.length:
        raise ManifestError(f"frame {index}: got {len(data)} of {frame.length} bytes (truncated)")
    if not digests.matches(data, frame.digest):
        raise ManifestError(f"frame {index}: checksum mismatch (corrupted)")
    try:
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise ManifestError(f"frame {index}: not a zstd frame: {describe(exc)}") from None
    if declared != frame.raw:
        raise ManifestError(
            f"frame {index}: header says {declared} bytes, the manifest {frame.raw}"
        )
    try:
        out: bytes = zstandard.ZstdDecompressor().decompress(data, max_output_size=frame.raw)
    except zstandard.ZstdError as exc:
        raise ManifestError(f"frame {index}: cannot decode: {describe(exc)}") from None
    if len(out) != frame.raw:
        raise ManifestError(f"frame {index}: decoded {len(out)} bytes, expected {frame.raw}")
    return out


def decode_frames(
    fetch: Callable[[int, int], bytes],
    frames: Sequence[Frame],
    *,
    threads: int,
    progress: Callable[[int], None] | None = None,
    max_raw: int | None = None,
    deadline: float | None = None,
) -> Iterator[bytes]:
    """Fetch, verify and decode frames with ``threads`` workers; yield them in order.

    ``fetch(offset, length)`` reads from the archive object; it is called from
    several threads at once. ``progress(fetched_bytes)`` is called per frame.
    A frame not there by ``deadline`` (``time.monotonic()``) is a :class:`TimeoutError`;
    a fetch that hangs is left behind, never waited for.
    """

    def one(i: int, f: Frame) -> bytes:
        if max_raw is not None and f.raw > max_raw:  # before fetching it
            raise ManifestError(f"frame {i}: unpacks to {f.raw} bytes, more than {max_raw}")
        return decode_frame(fetch(f.offset, f.length), f, i, max_raw)

    pool = cf.ThreadPoolExecutor(threads, thread_name_prefix="deps-decode")
    window: deque[tuple[int, Frame, cf.Future[bytes]]] = deque()
    pending = iter(enumerate(frames))
    try:
        for i, f in pending:
            window.append((i, f, pool.submit(one, i, f)))
            if len(window) >= 2 * threads:
                break
        while window:
            i, f, fut = window.popleft()
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not cf.wait([fut], timeout=left).done:
                raise TimeoutError(
                    f"frame {i} (offset {f.offset}) not fetched by the deadline: "
                    "the store or the peers do not answer"
                )
            data = fut.result()
            if progress:
                progress(f.length)
            nxt = next(pending, None)
            if nxt is not None:
                window.append((nxt[0], nxt[1], pool.submit(one, *nxt)))
            yield data
    finally:
        for _, _, fut in window:
            fut.cancel()
        # Not waiting: a fetch that hangs (a store that accepts and never answers) would
        # hold the caller past its deadline; what a running fetch returns is dropped.
        pool.shutdown(wait=False, cancel_futures=True)
