"""What a reader of part of a file costs the targets (issue 19, session 16): one rank of a
sharded load reads a quarter of a file from its middle. The read-ahead past the part's
end and the buffers an open file reads units into were most of what that rank's read
cost beyond the bytes it took (docs/performance.md, "A part of a checkpoint")."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from bootseer.ckpt import Namespace
from bootseer.ckpt import mount as ckpt_mount
from bootseer.ckpt.reader import FIRST_AHEAD, StripedReader
from bootseer.store import open_store
from tests.sitekeys import KEYS
from tests.waiting import wait_until

from .conftest import JOB_UID, needs_fuse, write_site_config
from .test_api import put

UNIT = 4096
READ_AHEAD = 16


@pytest.fixture
def wide(targets: list[str]) -> Namespace:
    """A namespace whose readers may read ``READ_AHEAD`` units ahead (the site default)."""
    return Namespace(
        [open_store(u) for u in targets], "ada/part", unit_size=UNIT, read_ahead=READ_AHEAD
    )


def settled(f: StripedReader) -> bool:
    return all(fut.done() for fut in list(f._units.values()))


def test_a_part_fetches_no_more_than_the_first_window_past_its_end(wide: Namespace) -> None:
    """The middle quarter of a 64-unit file, read a unit at a time by a reader slower than
    the targets: 16 units asked for, at most FIRST_AHEAD more fetched (and verified) for
    nothing. With a fixed read-ahead of ``read_ahead`` units it fetched 16 more."""
    data = os.urandom(64 * UNIT)
    put(wide, "f", data)
    with wide.open("f") as f:
        for i in range(24, 40):
            wait_until(lambda: settled(f), "the read-ahead")  # the targets keep ahead
            assert f.pread(i * UNIT, UNIT) == data[i * UNIT : (i + 1) * UNIT]
        wait_until(lambda: settled(f), "the read-ahead")
        assert f.fetched <= (16 + FIRST_AHEAD) * UNIT, f.fetched // UNIT
        assert f._ahead == FIRST_AHEAD


def test_the_window_grows_where_the_targets_are_slow(
    wide: Namespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that catches up with units still on their way has twice as many fetched
    ahead each time, up to ``read_ahead``: a target far away (S3) still has all K
    streaming at once."""
    data = os.urandom(48 * UNIT)
    put(wide, "f", data)
    fetch = StripedReader._fetch

    def slow(self: StripedReader, index: int) -> bytes | memoryview:
        time.sleep(0.02)
        return fetch(self, index)

    monkeypatch.setattr(StripedReader, "_fetch", slow)
    with wide.open("f") as f:
        assert f.read() == data
        assert f._ahead == READ_AHEAD


def test_the_next_file_reads_into_the_buffers_of_the_last(wide: Namespace) -> None:
    """A mount serves many opens: the second file's units land in the buffers the first
    one's used (fresh ones are zeroed by the kernel as they are first read into, which
    cost a 256 MiB part more CPU than hashing it), and no more are kept than one
    reading file needs."""
    a, b = os.urandom(40 * UNIT), os.urandom(40 * UNIT)
    put(wide, "a", a)
    put(wide, "b", b)
    with wide.open("a") as f:
        assert f.read() == a
    made = wide.buffers.made
    assert 0 < made <= READ_AHEAD + 4 + wide.max_inflight
    for name, data in (("b", b), ("a", a), ("b", b)):
        with wide.open(name) as f:
            assert f.read() == data
    # An open may find a few buffers still held for an instant (a thread lets go of its
    # last view just after): a few more in all, not a file's worth each (main: 3 x 20).
    assert wide.buffers.made - made < made // 2, (made, wide.buffers.made)


def test_files_written_in_turn_fill_the_same_buffers(wide: Namespace) -> None:
    """A checkpoint is many files saved in turn (a shard per rank, a file per tensor
    group): each file's units are filled in the namespace's buffers, which the next file
    written or read uses again. A pool per open file had the kernel zero fresh pages for
    each file's first ``max_inflight + 2`` units (80 MiB a file at the defaults)."""
    data = os.urandom(40 * UNIT)
    put(wide, "w0", data)
    made = wide.buffers.made
    assert 0 < made <= wide.max_inflight + 3, made  # + 1: the first unit's small buffer
    for i in range(1, 4):
        put(wide, f"w{i}", data)
    assert wide.buffers.made - made < made // 2, (made, wide.buffers.made)  # main: 3 x 10
    with wide.open("w3") as f:  # the writers' buffers, and what its read-ahead needs more
        assert f.read() == data
    assert wide.buffers.made <= READ_AHEAD + 4 + wide.max_inflight + 1, wide.buffers.made


@needs_fuse
def test_a_part_read_through_the_mount_fetches_little_past_it(
    tmp_path: Path, targets: list[str], mount_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a real mount, the kernel's reads of a 16-unit part of a 64-unit file cost
    the targets the part, the kernel's own read-ahead past it (``kernel_read_ahead_kb``,
    set to one unit here) and the daemon's first window: 19 units, where a read-ahead of
    ``read_ahead`` units fetched 33 (counted by the daemon, the epilog's totals)."""
    unit = 1 << 20
    write_site_config(tmp_path, targets, monkeypatch, unit_size=unit, read_ahead=READ_AHEAD)
    admin = Namespace([open_store(u) for u in targets], "nobody/part", unit_size=unit, keys=KEYS)
    put(admin, "f", os.urandom(64 * unit), chunk=unit)
    mp = ckpt_mount.prepare_mountpoint(mount_root, "44", JOB_UID, JOB_UID)
    state = tmp_path / "state"
    state.mkdir()
    rec = ckpt_mount.start(
        mp, "nobody/part", JOB_UID, JOB_UID, state, node="", timeout=60, read_ahead_kb=1024
    )
    try:
        # One unit at a time, pausing as a loader does between tensors: the targets
        # keep ahead of the reader, so the daemon's window stays as it starts.
        code = (
            "import os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
            f"for i in range(24, 40):\n"
            f"    assert len(os.pread(fd, {unit}, i * {unit})) == {unit}\n"
            "    time.sleep(0.05)\n"
            "os.close(fd)\n"
        )
        subprocess.run(
            [
                *("setpriv", f"--reuid={JOB_UID}", f"--regid={JOB_UID}", "--clear-groups"),
                *("/usr/bin/python3", "-c", code, f"{mp}/f"),
            ],
            check=True,
            cwd="/",
            timeout=60,
        )
    finally:
        res = ckpt_mount.stop(rec)
    assert res.totals.read_bytes >= 16 * unit
    assert res.totals.store_bytes <= (16 + 1 + FIRST_AHEAD) * unit, res.totals.store_bytes // unit
