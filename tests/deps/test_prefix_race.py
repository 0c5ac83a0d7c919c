"""The prolog checks a --bootseer-deps prefix, then fetches the snapshot (seconds, for a
large one), then the user's child makes the missing directories above the prefix and
extracts. A directory another user made in between, on the way to the prefix, was kept
by ``makedirs`` and the restore went into it."""

from __future__ import annotations

import io
import os
import pwd
import tarfile
from pathlib import Path

import pytest

from bootseer.deps.archive import SnapshotRejected, entry_of, extract_snapshot

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a directory of mallory's)"),
]


def _snapshot() -> tuple[int, list]:  # type: ignore[type-arg]
    buf = io.BytesIO()
    t = tarfile.TarInfo("bin/tool")
    t.size, t.mode = 10, 0o755
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        tf.addfile(t, io.BytesIO(b"#!/bin/sh\n"))
    r, w = os.pipe()
    os.write(w, buf.getvalue())
    os.close(w)
    return r, [entry_of(t)]


def test_a_directory_another_user_made_above_the_prefix_after_the_check_is_refused(
    tmp_path: Path,
) -> None:
    """bob's prefix /nodelocal/bob/env: /nodelocal/bob did not exist when the prolog
    checked; mallory made it (0777) while the frames came. Now the extraction checks
    again once the directories are there, refuses, and writes nothing in hers."""
    users = {p.pw_name for p in pwd.getpwall()}
    if "mallory" not in users:
        pytest.skip("needs slurm-dev's user mallory")
    mallory = pwd.getpwnam("mallory")
    nodelocal = tmp_path / "nodelocal"
    nodelocal.mkdir()
    nodelocal.chmod(0o1777)
    hers = nodelocal / "bob"
    hers.mkdir()
    os.chown(hers, mallory.pw_uid, mallory.pw_gid)
    hers.chmod(0o777)
    r, entries = _snapshot()
    try:
        with pytest.raises(SnapshotRejected, match=f"{hers} belongs to uid {mallory.pw_uid}"):
            extract_snapshot(
                r,
                str(hers / "env"),
                entries,
                raw_bytes=0,
                link_roots=[],
                max_bytes=1 << 20,
                max_files=10,
            )
    finally:
        os.close(r)
    assert list(hers.iterdir()) == []
    # Where no one else made anything, the same restore lands.
    r, entries = _snapshot()
    try:
        got = extract_snapshot(
            r,
            str(nodelocal / "root-own" / "env"),
            entries,
            raw_bytes=0,
            link_roots=[],
            max_bytes=1 << 20,
            max_files=10,
        )
    finally:
        os.close(r)
    assert got["entries"] == 1
