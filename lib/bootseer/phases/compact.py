"""Compaction: a day's many small files (one per node per flush) become one.

Each flush writes a small file; a year of a busy cluster is hundreds of thousands of
them, and opening files, not reading rows, is then what a report spends its time on.
``bootseer phase compact`` (daily, from cron or a timer) rewrites each finished day
as one file sorted by job, so a one-job lookup skips row groups by their statistics::

    phases/day=2026-11-20/job=4242/n1-r0-epilog-....parquet  (x thousands)
    -> phases/day=2026-11-20/part-<uuid>.parquet

Root's compaction merges only files whose seal verifies and seals the new one
(:mod:`bootseer.phases.seal`). The new file is complete before any old one goes; a
reader that sees both merges the duplicates (:func:`bootseer.phases.reader.merge`),
and a reader that loses a file to compaction mid-read lists again. Files that cannot
be read, or whose seal does not verify, stay where they are.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bootseer.phases.reader import PhaseDataset, merge, schema_problem, warn_stderr
from bootseer.phases.writer import PREFIX, file_bytes

if TYPE_CHECKING:
    import pyarrow as pa

    from bootseer.sitekey import SiteKeys
    from bootseer.store import Store


@dataclass(frozen=True)
class Compacted:
    day: str
    files_in: int
    rows_out: int
    key: str
    refused: int = 0  # files left where they are: their seal did not verify


def sort_rows(table: pa.Table) -> pa.Table:
    return table.sort_by(
        [
            ("job_id", "ascending"),
            ("restart_count", "ascending"),
            ("node", "ascending"),
            ("start", "ascending"),
        ]
    )


def write_day(store: Store, day: str, table: pa.Table, keys: SiteKeys | None = None) -> str:
    key = f"{PREFIX}/day={day}/part-{uuid.uuid4().hex}.parquet"
    store.write_bytes(key, file_bytes(keys, key, sort_rows(table)))
    return key


def compact(
    store: Store,
    older_than_days: float = 1.0,
    on_skip: Callable[[str], None] = warn_stderr,
    progress: Callable[[Compacted], None] | None = None,
    now: float | None = None,
    keys: SiteKeys | None = None,
) -> list[Compacted]:
    """Compact every day partition that ended more than ``older_than_days`` ago and has
    more than one file. With ``keys`` (root's ``bootseer phase compact``) only files whose
    seal verifies are merged, and the day's file is sealed: a forged file is never folded
    into a sealed one; it stays where it is, uncounted by root's reports."""
    now = time.time() if now is None else now
    last_day = time.strftime("%Y-%m-%d", time.gmtime(now - older_than_days * 86400 - 86400))
    ds = PhaseDataset(store, on_skip=on_skip)
    by_day: dict[str, list[str]] = {}
    for f in ds.files():
        if f.day <= last_day:
            by_day.setdefault(f.day, []).append(f.key)
    done = []
    for day, day_keys in sorted(by_day.items()):
        if len(day_keys) < 2:
            continue
        day_ds = PhaseDataset(store, on_skip=on_skip, keys=keys)
        table = merge(day_ds.read_files(day_keys))
        refused = set() if day_ds.seals is None else set(day_ds.seals.refused)
        readable = [k for k in day_keys if store.path(k) not in day_ds.skipped and k not in refused]
        if len(readable) < 2 and refused:
            continue  # nothing to merge but what stays
        key = write_day(store, day, table, keys)
        for k in readable:
            store.delete(k)
        c = Compacted(day, len(readable), table.num_rows, key, len(refused))
        done.append(c)
        if progress:
            progress(c)
    return done


def adopt_unsealed(
    store: Store, keys: SiteKeys, on_skip: Callable[[str], None] = warn_stderr
) -> list[str]:
    """Seal, as they are, the phase files that carry no seal at all (written before
    bootseer sealed them): the admin vouches for them, once, after upgrading, while no
    one else could write the store. A file whose seal does not verify is never adopted.
    Returns the keys sealed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bootseer.phases.seal import MAX_FILE_BYTES, seal_table, verdict

    adopted = []
    for f in PhaseDataset(store, on_skip=on_skip).files():
        raw = store.read_bytes(f.key, limit=MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES or verdict(keys, f.key, raw) != "unsealed":
            continue
        try:
            table = pq.read_table(pa.BufferReader(raw))
        except (OSError, pa.ArrowException) as exc:
            on_skip(f"not adopted {store.path(f.key)}: not a readable Parquet file ({exc})")
            continue
        problem = schema_problem(table.schema)
        if problem:
            on_skip(f"not adopted {store.path(f.key)}: not a phase records file ({problem})")
            continue
        store.write_bytes(f.key, seal_table(keys, f.key, table))
        adopted.append(f.key)
    return adopted
