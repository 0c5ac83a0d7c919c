"""The node's memory of its last-use marks (bootseer.deps.nodecache): a snapshot is
marked in the store at most once per MARK_EVERY per node, and old marks are forgotten."""

from __future__ import annotations

import os
import time
from pathlib import Path

from bootseer.deps import nodecache


def test_a_mark_counts_for_an_hour_then_is_forgotten(tmp_path: Path) -> None:
    assert not nodecache.marked_lately(tmp_path, "user/ada", "a" * 32)
    nodecache.note_marked(tmp_path, "user/ada", "a" * 32)
    assert nodecache.marked_lately(tmp_path, "user/ada", "a" * 32)
    assert not nodecache.marked_lately(tmp_path, "user/bob", "a" * 32)  # per scope and key
    (mark,) = list((tmp_path / "deps" / "marks").iterdir())
    old = time.time() - nodecache.MARK_EVERY - 1
    os.utime(mark, (old, old))
    assert not nodecache.marked_lately(tmp_path, "user/ada", "a" * 32)
    os.utime(mark, (old - 2 * nodecache.MARK_EVERY, old - 2 * nodecache.MARK_EVERY))
    nodecache.note_marked(tmp_path, "user/ada", "b" * 32)  # forgets marks too old to matter
    assert [p.name for p in (tmp_path / "deps" / "marks").iterdir()] != [mark.name]
    assert len(list((tmp_path / "deps" / "marks").iterdir())) == 1
