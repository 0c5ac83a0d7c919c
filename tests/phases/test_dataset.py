"""Writer, reader, merge and compaction against a real file:// store."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from bootseer.phases.compact import compact
from bootseer.phases.reader import PhaseDataset
from bootseer.phases.schema import JobMeta, from_table
from bootseer.phases.writer import write_rows
from bootseer.store import Store, open_store

from .conftest import T0, node_rows


def test_layout_partitions_by_day_and_job(store: Store, dataset: PhaseDataset) -> None:
    key = write_rows(store, node_rows(42, "n1"), source="epilog")
    assert key is not None
    assert key.startswith("phases/day=2026-09-21/job=42/n1-r0-epilog-") and key.endswith(".parquet")
    assert write_rows(store, [], source="epilog") is None
    assert dataset.job(42).num_rows == 7
    assert dataset.job(43).num_rows == 0


def test_one_job_is_read_without_opening_other_jobs_files(store: Store) -> None:
    write_rows(store, node_rows(1, "n1"), source="epilog")
    write_rows(store, node_rows(2, "n1"), source="epilog")
    opened: list[str] = []
    ds = PhaseDataset(store)
    real = ds._fragment

    def spy(fmt: Any, key: str) -> Any:
        opened.append(key)
        return real(fmt, key)

    ds._fragment = spy  # type: ignore[method-assign]
    assert ds.job(2).num_rows == 7
    assert all("/job=2/" in k for k in opened) and opened


def _writer(root: str, worker: int, files: int) -> None:
    store = open_store(f"file://{root}")
    for i in range(files):
        rows = node_rows(100 + i % 3, f"n{worker}", name=f"w{worker}", t0=T0 + i)
        write_rows(store, rows, source="epilog")


def test_concurrent_writers_from_several_processes_lose_nothing(tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    open_store(f"file://{root}")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(root, w, 12)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    store = open_store(f"file://{root}")
    files = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
    assert len(files) == 4 * 12 and not any(".tmp-" in f for f in files)
    warned: list[str] = []
    ds = PhaseDataset(store, on_skip=warned.append)
    # 4 nodes x 3 jobs x 7 phases once merged: each (job, node) was written 4 times
    # with starts 0..11 s apart, so merged rows span them.
    total = sum(ds.job(j).num_rows for j in (100, 101, 102))
    assert total == 4 * 3 * 7 and warned == []


def test_corrupt_and_foreign_files_are_skipped_with_a_warning(
    store: Store, dataset: PhaseDataset, warnings_seen: list[str]
) -> None:
    key = write_rows(store, node_rows(5, "n1"), source="epilog")
    assert key is not None
    good = store.read_bytes(key)
    store.write_bytes("phases/day=2026-09-21/job=5/torn.parquet", good[: len(good) // 2])
    store.write_bytes("phases/day=2026-09-21/job=5/junk.parquet", b"PAR1 nothing here")
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"job_id": ["5"], "phase": ["x"]}), sink)
    store.write_bytes("phases/day=2026-09-21/job=5/foreign.parquet", sink.getvalue().to_pybytes())
    assert dataset.job(5).num_rows == 7
    assert len(warnings_seen) == 3
    assert any("foreign.parquet: not a phase records file" in w for w in warnings_seen)
    assert any("torn.parquet" in w for w in warnings_seen)


def test_rows_written_by_two_flushes_merge_into_one(store: Store, dataset: PhaseDataset) -> None:
    m = JobMeta(6, node="n1", node_count=1)
    write_rows(store, [m.row("ckpt_load", T0, T0 + 5)], source="marks")
    write_rows(store, [m.row("ckpt_load", T0, T0 + 7, "failed")], source="epilog")
    (row,) = from_table(dataset.job(6))
    assert (row.end - row.start, row.outcome) == (7, "failed")


def test_compaction_makes_one_file_per_day_and_keeps_every_row(
    store: Store, dataset: PhaseDataset
) -> None:
    for job in (1, 2, 3):
        for node in ("n1", "n2"):
            write_rows(store, node_rows(job, node, nodes=2), source="epilog")
    write_rows(store, node_rows(1, "n1", nodes=2), source="prolog")  # a duplicate flush

    def rows() -> dict[int, list[tuple[object, ...]]]:
        return {
            j: sorted(dataclasses.astuple(r) for r in from_table(dataset.job(j))) for j in (1, 2, 3)
        }

    before = rows()
    done = compact(store, now=T0 + 3 * 86400)
    assert [(c.day, c.files_in, c.rows_out) for c in done] == [("2026-09-21", 7, 42)]
    assert [f.job_id for f in dataset.files()] == [None]
    assert rows() == before
    assert compact(store, now=T0 + 3 * 86400) == []  # one file: nothing to do


def test_compaction_keeps_a_file_it_could_not_read(store: Store) -> None:
    for job in (1, 2):
        write_rows(store, node_rows(job, "n1", nodes=1), source="epilog")
    day = next(f.day for f in PhaseDataset(store).files())
    broken = f"phases/day={day}/job=9/n1-0-epilog-broken.parquet"
    store.write_bytes(broken, b"not parquet")
    skipped: list[str] = []
    (done,) = compact(store, now=T0 + 3 * 86400, on_skip=skipped.append)
    assert done.files_in == 2 and any("broken" in m for m in skipped)
    assert store.exists(broken)  # never deleted: its rows are not in the compacted file


def test_today_is_not_compacted(store: Store) -> None:
    write_rows(store, node_rows(1, "n1"), source="epilog")
    write_rows(store, node_rows(1, "n2"), source="epilog")
    assert compact(store, now=T0 + 3600) == []


def test_cluster_reads_skip_flushes_an_epilog_supersedes(store: Store) -> None:
    m = JobMeta(8, node="n1", node_count=1)
    write_rows(store, [m.row("prolog", T0, T0 + 1)], source="prolog")
    write_rows(store, [m.row("ckpt_load", T0 + 2, T0 + 3)], source="marks")
    write_rows(store, [JobMeta(8, 1, node="n1").row("prolog", T0 + 9, T0 + 10)], source="prolog")
    ds = PhaseDataset(store)
    assert ds.since(T0, exact=False).num_rows == 3  # no epilog yet: every flush counts
    write_rows(
        store,
        [
            m.row("prolog", T0, T0 + 1),
            m.row("ckpt_load", T0 + 2, T0 + 3),
            m.row("epilog", T0 + 5, T0 + 6),
        ],
        source="epilog",
    )
    rows = from_table(ds.since(T0, exact=False))
    assert sorted((r.restart_count, r.phase) for r in rows) == [
        (0, "ckpt_load"),
        (0, "epilog"),
        (0, "prolog"),
        (1, "prolog"),
    ]
