"""Bytes from the store and bytes from peers: typed columns from the steps to the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from bootseer.agentapi.client import AgentClient
from bootseer.agentapi.jobs import (
    FillSummary,
    JobReply,
    PeerSummary,
    PrefetchSummary,
    Prepare,
    Release,
    ReleaseReply,
)
from bootseer.image import step
from bootseer.jsondecode import decode
from bootseer.options import Options
from bootseer.phases.compact import compact
from bootseer.phases.reader import PhaseDataset
from bootseer.phases.report import job_report
from bootseer.phases.schema import COLUMNS, JobMeta, PhaseRow, from_table, to_table
from bootseer.phases.spool import Spool, parse_mark, rows_from_marks
from bootseer.phases.writer import parquet_bytes, write_rows
from bootseer.stepapi import StepCall
from bootseer.store import Store
from tests import hookkit
from tests.hookkit import job_context
from tests.imagekit import node_config

from .conftest import T0

MiB = 1 << 20


def image_rows(node: str, store_mib: int, peer_mib: int, job_id: int = 50) -> list[PhaseRow]:
    m = JobMeta(job_id, 0, "train", "ada", "ml", node, 2, 0, T0 - 10)
    return [
        m.row("prolog", T0, T0 + 3),
        m.row(
            "image_prefetch",
            T0 + 0.1,
            T0 + 2.9,
            bytes=(store_mib + peer_mib) * MiB,
            store_bytes=store_mib * MiB,
            peer_bytes=peer_mib * MiB,
        ),
        m.row("ckpt_load", T0 + 3, T0 + 5, bytes=7 * MiB),  # a job mark: bytes only
        m.row("first_step", T0 + 5, T0 + 6),
        m.row(
            "image_background_fill",
            T0 + 6,
            T0 + 20,
            bytes=10 * MiB,
            store_bytes=4 * MiB,
            peer_bytes=6 * MiB,
        ),
    ]


def test_columns_sit_next_to_bytes_and_round_trip_through_parquet(
    store: Store, dataset: PhaseDataset
) -> None:
    names = [n for n, _ in COLUMNS]
    assert names[names.index("bytes") : names.index("bytes") + 3] == [
        "bytes",
        "store_bytes",
        "peer_bytes",
    ]
    rows = image_rows("n1", 3, 5)
    write_rows(store, rows, source="epilog")
    back = {r.phase: r for r in from_table(dataset.job(50))}
    assert back["image_prefetch"] == rows[1]
    assert (back["image_prefetch"].store_bytes, back["image_prefetch"].peer_bytes) == (
        3 * MiB,
        5 * MiB,
    )
    assert (back["ckpt_load"].store_bytes, back["ckpt_load"].peer_bytes) == (0, 0)


def test_a_file_written_before_the_columns_reads_as_zero(
    store: Store, dataset: PhaseDataset, warnings_seen: list[str]
) -> None:
    old = to_table(image_rows("n1", 3, 5)).drop_columns(["store_bytes", "peer_bytes"])
    assert "store_bytes" not in old.column_names
    store.write_bytes(
        "phases/day=2026-09-21/job=50/n1-r0-epilog-0123456789ab.parquet", parquet_bytes(old)
    )
    write_rows(store, image_rows("n2", 2, 6), source="epilog")  # a newer node's file beside it
    table = dataset.job(50)
    assert warnings_seen == []
    assert table.column("store_bytes").null_count == 0
    by_node = {(r.node, r.phase): r for r in from_table(table)}
    assert by_node["n1", "image_prefetch"].bytes == 8 * MiB
    assert (
        by_node["n1", "image_prefetch"].store_bytes,
        by_node["n1", "image_prefetch"].peer_bytes,
    ) == (0, 0)
    assert by_node["n2", "image_prefetch"].store_bytes == 2 * MiB
    (run,) = job_report(dataset, 50).runs
    assert (run.store_egress_bytes, run.peer_bytes) == (6 * MiB, 12 * MiB)
    # Compaction writes the columns, as 0, for the old file's rows.
    compact(store, now=T0 + 3 * 86400)
    (part,) = [f for f in dataset.files()]
    assert part.job_id is None
    written = pq.read_table(store.path(part.key), filesystem=store.fs)
    assert written.column("peer_bytes").null_count == 0
    assert from_table(dataset.job(50)) == from_table(table)


def test_flushes_merge_and_compaction_keep_the_largest_counts(
    store: Store, dataset: PhaseDataset
) -> None:
    m = JobMeta(51, node="n1", node_count=1)
    write_rows(store, [m.row("ckpt_load", T0, T0 + 5, store_bytes=5, peer_bytes=9)], source="marks")
    write_rows(
        store, [m.row("ckpt_load", T0, T0 + 7, store_bytes=8, peer_bytes=2)], source="epilog"
    )
    (row,) = from_table(dataset.job(51))
    assert (row.end - row.start, row.store_bytes, row.peer_bytes) == (7, 8, 9)
    compact(store, now=T0 + 3 * 86400)
    assert [f.job_id for f in dataset.files()] == [None]
    assert from_table(dataset.job(51)) == [row]


def test_report_sums_store_and_peer_bytes_per_phase_node_and_run(
    store: Store, dataset: PhaseDataset
) -> None:
    write_rows(store, image_rows("n1", 3, 5), source="epilog")
    write_rows(store, image_rows("n2", 5, 3), source="epilog")
    data: Any = job_report(dataset, 50).to_json()
    (run,) = data["runs"]
    assert run["store_egress_bytes"] == (3 + 5 + 4 + 4) * MiB
    assert run["peer_bytes"] == (5 + 3 + 6 + 6) * MiB
    phases = {p["phase"]: p for p in run["phases"]}
    assert (phases["image_prefetch"]["store_bytes"], phases["image_prefetch"]["peer_bytes"]) == (
        8 * MiB,
        8 * MiB,
    )
    assert phases["ckpt_load"]["bytes"] == 14 * MiB and phases["ckpt_load"]["store_bytes"] == 0
    nodes = {n["node"]: n for n in run["nodes"]}
    assert (nodes["n1"]["store_bytes"], nodes["n1"]["peer_bytes"]) == (7 * MiB, 11 * MiB)
    pre = next(p for p in nodes["n2"]["phases"] if p["phase"] == "image_prefetch")
    assert (pre["store_bytes"], pre["peer_bytes"]) == (5 * MiB, 3 * MiB)
    assert json.loads(json.dumps(data)) == data


def test_report_text_shows_store_egress_and_fits_80_columns(store: Store) -> None:
    write_rows(store, image_rows("n1", 3, 5), source="epilog")
    write_rows(store, image_rows("n2", 5, 3), source="epilog")
    r = subprocess.run(
        [sys.executable, "-m", "bootseer.cli", "report", "50", "--store", store.uri],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert r.returncode == 0, r.stderr
    assert "Store egress 16.0 MiB, from peers 20.0 MiB" in r.stdout
    lines = r.stdout.splitlines()
    # In the phase table, or where it would not fit 80 columns, in a table of its own.
    fill = next(ln for ln in lines if "image_background_fill" in ln and "MiB" in ln)
    assert fill.split()[-6:] == ["20.0", "MiB", "8.0", "MiB", "12.0", "MiB"], r.stdout
    assert max(len(ln.rstrip()) for ln in lines) <= 80


# -- job marks ---------------------------------------------------------------------------


def test_marks_carry_store_and_peer_bytes() -> None:
    meta = JobMeta(52, node="n1")
    events = [
        parse_mark({"ev": "start", "phase": "ckpt_load", "t": T0, "task": "0.0"}),
        parse_mark(
            {
                "ev": "end",
                "phase": "ckpt_load",
                "t": T0 + 2,
                "task": "0.0",
                "bytes": 9,
                "store_bytes": 4,
                "peer_bytes": 5,
            }
        ),
        parse_mark({"ev": "start", "phase": "ckpt_load", "t": T0, "task": "0.1"}),
        parse_mark(
            {"ev": "end", "phase": "ckpt_load", "t": T0 + 3, "task": "0.1", "store_bytes": 1}
        ),
    ]
    (row,) = rows_from_marks(events, meta, final=True)
    assert (row.bytes, row.store_bytes, row.peer_bytes) == (9, 5, 5)
    for bad in (-1, True, "5"):
        with pytest.raises(ValueError):
            parse_mark({"ev": "end", "phase": "x", "t": T0, "peer_bytes": bad})


def test_spool_lines_from_before_the_columns_still_read(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 53)
    spool.path.mkdir(parents=True)
    old = JobMeta(53, node="n1").row("prolog", T0, T0 + 1).to_dict()
    del old["store_bytes"], old["peer_bytes"]
    (spool.path / "rows.jsonl").write_text(json.dumps(old) + "\n")
    (row,) = spool.hook_rows()
    assert (row.store_bytes, row.peer_bytes) == (0, 0)


# -- the image step fills them -----------------------------------------------------------


def step_call(tmp_path: Path, hook: str) -> StepCall:
    image = Options(mode="on", image="/images/x.sqsh")
    return hookkit.step_call(node_config(tmp_path), job_context(image, nodes=("n1", "n2")), hook)


def job_reply(peers: dict[str, Any] | None, fill: dict[str, Any] | None = None) -> JobReply:
    return JobReply(
        job_id=7,
        path="/mnt/7.sqsh",
        image="ab" * 32,
        ref="/images/x.sqsh",
        size=100 * MiB,
        block_size=MiB,
        blocks=100,
        trace_runs=1,
        prefetch=PrefetchSummary(hot_blocks=10, hot_bytes=10 * MiB, fetched_bytes=10 * MiB),
        fill=decode(FillSummary, fill) if fill else None,
        recorded_blocks=12,
        first_step_at=T0 + 5,
        fetched_before_first_step=13 * MiB,
        peers=decode(PeerSummary, peers) if peers else None,
    )


@pytest.mark.parametrize(
    ("peers", "want"),
    [
        (None, (10 * MiB, 0)),  # no peers: every fetched byte came from the store
        (
            {"store_bytes": 9, "peer_bytes": 9, "at_prepare": {"store_bytes": 6, "peer_bytes": 4}},
            (6, 4),
        ),
    ],
)
def test_prolog_image_row_counts_store_and_peer_bytes(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    peers: dict[str, Any] | None,
    want: tuple[int, int],
) -> None:
    def ask(self: AgentClient, request: Prepare, timeout: float) -> JobReply:
        return job_reply(peers)

    monkeypatch.setattr(AgentClient, "ask", ask)
    result = step.prolog(step_call(tmp_path, "prolog"))
    assert (result.bytes, result.store_bytes, result.peer_bytes) == (10 * MiB, *want)
    assert "store_bytes" not in result.detail and "hot_bytes=" in result.detail


def test_epilog_splits_the_fill_from_the_jobs_own_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill = {
        "state": "done",
        "start": T0 + 5.0,
        "end": T0 + 9.0,
        "blocks": 90,
        "done": 90,
        "failed": 0,
        "bytes": 90 * MiB,
    }
    peers = {
        "store_bytes": 60 * MiB,
        "peer_bytes": 50 * MiB,
        "peer_failures": 0,
        "corrupt": 0,
        "at_prepare": {"store_bytes": 5 * MiB, "peer_bytes": 5 * MiB},
        "at_fill": {"store_bytes": 7 * MiB, "peer_bytes": 6 * MiB},
    }

    def ask(self: AgentClient, request: Release, timeout: float) -> ReleaseReply:
        return ReleaseReply(released=True, trace="unchanged", job=job_reply(peers, fill))

    monkeypatch.setattr(AgentClient, "ask", ask)
    call = step_call(tmp_path, "epilog")
    result = step.epilog(call)
    # Between the prolog and the fill: the job's own reads.
    assert (result.store_bytes, result.peer_bytes) == (2 * MiB, 1 * MiB)
    (row,) = result.rows  # the fill's row, which the hook runner records
    assert row.phase == "image_background_fill" and row.bytes == 90 * MiB
    assert (row.start, row.end, row.outcome) == (T0 + 5.0, T0 + 9.0, "ok")
    assert (row.store_bytes, row.peer_bytes) == (53 * MiB, 44 * MiB)
    assert "fetched_before_first_step=" in result.detail

    # No peers: the fill's bytes and the reads after the prefetch came from the store.
    peers.clear()
    result = step.epilog(call)
    assert (result.store_bytes, result.peer_bytes) == (3 * MiB, 0)
    (row,) = result.rows
    assert (row.store_bytes, row.peer_bytes) == (90 * MiB, 0)

    # A fill still running when the job ended is cut off there; none started, no row.
    fill.update(state="running", end=None)
    (row,) = step.epilog(call).rows
    assert row.outcome == "skipped" and row.end > T0 + 9.0
    fill.update(start=None)
    assert step.epilog(call).rows == []
