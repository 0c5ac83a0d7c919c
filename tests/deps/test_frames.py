"""A restore's frames in flight: fetching a frame waits on the agent or the store, so
a node with few cores still keeps FETCH_PARALLEL of them coming."""

from __future__ import annotations

import io
import os
import threading

import pytest

from bootseer.deps import frames as frames_mod
from bootseer.deps.frames import FETCH_PARALLEL, decode_frames, encode_stream, restore_threads


def test_a_restore_on_a_two_core_node_fetches_eight_frames_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    raw = os.urandom(64 << 10) * 24
    out = io.BytesIO()
    frames = encode_stream(
        io.BytesIO(raw).readinto, out.write, frame_bytes=64 << 10, level=1, threads=2
    )
    assert len(frames) >= 2 * FETCH_PARALLEL
    data = out.getvalue()
    # Each of the first FETCH_PARALLEL fetches waits for all of them: fewer at once
    # (a worker per core: 2) break the barrier after its timeout.
    together = threading.Barrier(FETCH_PARALLEL, timeout=60)
    first = {f.offset for f in frames[:FETCH_PARALLEL]}

    def fetch(offset: int, length: int) -> bytes:
        if offset in first:
            together.wait()
        return data[offset : offset + length]

    got = b"".join(decode_frames(fetch, frames, threads=restore_threads(0)))
    assert got == raw
    assert restore_threads(3) == 3  # the site's [deps] threads, when set
    assert frames_mod.default_threads(0) == 2  # captures still one per core
