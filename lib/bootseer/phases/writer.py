"""Write phase rows to the store as one Parquet file per flush.

The dataset is Hive-partitioned by day, then by job::

    phases/day=2026-11-21/job=4242/n1-r0-prolog-3f9c2a1b7d0e.parquet   one flush of one node
    phases/day=2026-11-21/part-8e1d...parquet                       a compacted day

``day`` is the UTC day of the earliest row in the file, so every row of a job run
that started on or after a day sits in that day's partition or a later one. The name
says node, run (restart count) and flush (prolog, marks, epilog): a reader that sees a
node's epilog file for a run needs none of its earlier flushes of that run. Every
file has a name no other writer uses (node, source, random suffix) and appears
whole or not at all (``Store.writer``): many nodes flushing at once never collide.
A reader merges rows that more than one flush wrote (:mod:`bootseer.phases.reader`).
Root-run writers seal each file with the site key (:mod:`bootseer.phases.seal`).

    >>> from bootseer.store import open_store
    >>> from bootseer.phases.schema import JobMeta
    >>> store = open_store("file:///tmp/doc-phases")
    >>> meta = JobMeta(job_id=7, node="n1")
    >>> write_rows(store, [meta.row("prolog", 1e9, 1e9 + 2)], source="prolog")  # doctest: +ELLIPSIS
    'phases/day=2001-09-09/job=7/n1-r0-prolog-...parquet'
"""

from __future__ import annotations

import re
import time
import uuid
from typing import TYPE_CHECKING, Literal

from bootseer.phases.schema import PhaseRow, to_table
from bootseer.phases.seal import parquet_bytes, seal_table

if TYPE_CHECKING:
    import pyarrow as pa

    from bootseer.sitekey import SiteKeys
    from bootseer.store import Store

__all__ = ["PREFIX", "Flush", "file_bytes", "file_key", "parquet_bytes", "write_rows"]

PREFIX = "phases"
# Which flush wrote a file: the prolog's hook rows, the job's marks so far (the background
# flush after first_step), or the epilog's everything (bootseer.phases.flush).
Flush = Literal["prolog", "marks", "epilog"]
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def day_of(t: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(t))


def file_key(day: str, job_id: int, node: str, restart: int, source: Flush) -> str:
    node = _SAFE.sub("_", node)[:64] or "unknown"
    name = f"{node}-r{int(restart)}-{source}-{uuid.uuid4().hex[:12]}.parquet"
    return f"{PREFIX}/day={day}/job={int(job_id)}/{name}"


def file_bytes(keys: SiteKeys | None, key: str, table: pa.Table) -> bytes:
    """``table`` as the Parquet file at ``key``: sealed with ``keys`` (a root-run writer),
    unsealed with None (:mod:`bootseer.phases.seal`)."""
    if keys is None:
        return parquet_bytes(table)
    return seal_table(keys, key, table)


def write_rows(
    store: Store, rows: list[PhaseRow], source: Flush, keys: SiteKeys | None = None
) -> str | None:
    """Write ``rows`` (one job, one node) as one new file, sealed with ``keys`` (root's
    flushes); return its key, or None if empty."""
    if not rows:
        return None
    first = min(rows, key=lambda r: r.start)
    key = file_key(day_of(first.start), first.job_id, first.node, first.restart_count, source)
    store.write_bytes(key, file_bytes(keys, key, to_table(rows)))
    return key
