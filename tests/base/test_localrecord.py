"""One policy for the small records root keeps on a node (bootseer.localrecord): whole or
not at all, never through a link, bounded, decoded into their type."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from bootseer import localrecord
from bootseer.agent.restart import SavedJob
from bootseer.ckpt.mount import MountRecord
from bootseer.ckpt.totals import MountTotals
from bootseer.localrecord import RecordError


@dataclass(frozen=True)
class Rec:
    name: str
    count: int = 0


def test_a_record_round_trips_with_its_mode(tmp_path: Path) -> None:
    localrecord.write(tmp_path / "r.json", Rec("a", 3), mode=0o640)
    assert localrecord.read(Rec, tmp_path / "r.json") == Rec("a", 3)
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o640
    assert localrecord.read(Rec, tmp_path / "none.json") is None


def test_a_link_at_the_path_is_replaced_on_write_and_refused_on_read(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "r.json").symlink_to(victim)
    with pytest.raises(RecordError, match=r"r\.json"):
        localrecord.read(Rec, tmp_path / "r.json")
    localrecord.write(tmp_path / "r.json", Rec("a"))
    assert victim.read_text() == "precious"  # written beside, renamed over the link
    assert not (tmp_path / "r.json").is_symlink()


def test_a_fifo_at_the_path_is_refused_without_waiting(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "r.json")
    with pytest.raises(RecordError, match="not a regular file"):
        localrecord.read(Rec, tmp_path / "r.json")


def test_a_record_over_its_bound_or_of_the_wrong_shape_is_refused_naming_why(
    tmp_path: Path,
) -> None:
    (tmp_path / "big.json").write_text('{"name": "' + "x" * 100 + '"}')
    with pytest.raises(RecordError, match="larger than 64 bytes"):
        localrecord.read(Rec, tmp_path / "big.json", max_bytes=64)
    (tmp_path / "bad.json").write_text('{"name": "a", "count": "3"}')
    with pytest.raises(RecordError, match="count must be a whole number"):
        localrecord.read(Rec, tmp_path / "bad.json")
    (tmp_path / "short.json").write_text('{"count": 3}')
    with pytest.raises(RecordError, match="name is required"):
        localrecord.read(Rec, tmp_path / "short.json")


def test_a_failed_write_leaves_the_old_record_and_no_temp_file(tmp_path: Path) -> None:
    localrecord.write(tmp_path / "r.json", Rec("old"))

    class Unwritable:
        pass

    with pytest.raises(TypeError):
        localrecord.write(tmp_path / "r.json", Unwritable())
    assert localrecord.read(Rec, tmp_path / "r.json") == Rec("old")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_the_nine_records_keep_their_files_and_refuse_what_is_not_theirs(tmp_path: Path) -> None:
    rec = MountRecord(42, "/mnt/x", "alice/p", "/var/log/x.log")
    rec.save(tmp_path)
    assert MountRecord.load(tmp_path) == rec
    (tmp_path / "mount.json").write_text('{"pid": "42"}')
    assert MountRecord.load(tmp_path) is None  # damaged: not trusted, not a crash
    MountTotals(1, 2, 3, 4, 5, 6).write(tmp_path / "t.json")
    assert MountTotals.read(tmp_path / "t.json") == MountTotals(1, 2, 3, 4, 5, 6)
    (tmp_path / "t.json").write_text('{"read_bytes": -1}')
    assert MountTotals.read(tmp_path / "t.json") is None  # counts are never negative
    job = SavedJob(7, 1000, 1000, "x:1", "ab" * 32, False, "/a.sqsh", (1, 2, 3, 4))
    localrecord.write(tmp_path / "7.json", job)
    assert localrecord.read(SavedJob, tmp_path / "7.json") == job
    (tmp_path / "7.json").write_text(
        '{"job_id": 7, "uid": 1, "gid": 1, "ref": "r", "image": "i", "refresh": false,'
        ' "path": "/a", "file": [1, 2, 3]}'
    )
    with pytest.raises(RecordError, match=r"file must be a list of 4 items"):
        localrecord.read(SavedJob, tmp_path / "7.json")
