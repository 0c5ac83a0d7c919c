"""Read the phase dataset: one job, or every run since a time; bad files skipped.

Only the files that can hold the rows asked for are opened: a job's own
``job=ID`` directories plus the compacted day files (whose row groups are skipped
by their ``job_id`` statistics), or the day partitions from ``since`` on. A file that
is not Parquet, or Parquet without the phase columns, is skipped with a warning.
Rows more than one flush wrote are merged (:func:`merge`)::

    >>> from bootseer.store import open_store
    >>> from bootseer.phases.schema import JobMeta
    >>> from bootseer.phases.writer import write_rows
    >>> store = open_store("file:///tmp/doc-phases")
    >>> _ = write_rows(store, [JobMeta(job_id=7, node="n1").row("prolog", 1e9, 1e9 + 2)], "prolog")
    >>> ds = PhaseDataset(store)
    >>> ds.job(7).num_rows >= 1
    True
"""

from __future__ import annotations

import concurrent.futures as cf
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bootseer.phases.schema import COLUMNS, REQUIRED, arrow_schema, fill_counts
from bootseer.phases.seal import MARK, MAX_FILE_BYTES, META_KEY, Tally, Verdict, verdict
from bootseer.phases.writer import PREFIX

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.dataset as pads

    from bootseer.sitekey import SiteKeys
    from bootseer.store import Store

KEY = ("job_id", "restart_count", "node", "phase")
_OUTCOME_RANK = ("skipped", "ok", "timed_out", "failed")
_FILE = re.compile(r"^day=(\d{4}-\d\d-\d\d)/(?:job=(\d+)/)?([^/]+)\.parquet$")
_FLUSH = re.compile(r"^(.+)-r(\d+)-(prolog|marks|epilog)-[0-9a-f]+$")


@dataclass(frozen=True)
class DataFile:
    key: str
    day: str
    job_id: int | None  # None for a compacted day file
    flush: tuple[str, int, str] | None = None  # (node, restart, prolog|marks|epilog)


def superseded(files: list[DataFile]) -> set[str]:
    """Keys of prolog/marks flushes whose rows a later epilog flush of the same job, run
    and node also holds (the epilog writes everything the node spooled)."""
    done = {
        (f.job_id, f.flush[0], f.flush[1])
        for f in files
        if f.flush is not None and f.flush[2] == "epilog"
    }
    return {
        f.key
        for f in files
        if f.flush is not None
        and f.flush[2] != "epilog"
        and (f.job_id, f.flush[0], f.flush[1]) in done
    }


def warn_stderr(message: str) -> None:
    print(f"bootseer: warning: {message}", file=sys.stderr)


class PhaseDataset:
    """The phase dataset of ``store``. Seals (:mod:`bootseer.phases.seal`) are checked
    with ``keys`` (root's reports: a file whose seal does not verify, or without one, is
    not read); with ``check_seals`` and no key (a user's report; ``unchecked_why`` says
    why there is none) files without a seal are read and counted in :attr:`seals`, to be
    shown as such; by default seals are not looked at (a library reading what it wrote)."""

    def __init__(
        self,
        store: Store,
        on_skip: Callable[[str], None] = warn_stderr,
        keys: SiteKeys | None = None,
        check_seals: bool = False,
        unchecked_why: str = "",
    ) -> None:
        self.store = store
        self.on_skip = on_skip
        self.keys = keys
        self.skipped: set[str] = set()  # store paths of files that could not be read
        # What the reads found of the files' seals; None where they are not looked at.
        self.seals = (
            Tally(keys is not None, "" if keys is not None else unchecked_why)
            if keys is not None or check_seals
            else None
        )
        # Mark rows outside their run's window (phases.window), over every read so far.
        self.marks_dropped = 0
        self.marks_clipped = 0

    def read_files(self, keys: list[str]) -> pa.Table:
        """All rows of these files; the unreadable ones end up in :attr:`skipped` (and
        those whose seal is refused in :attr:`seals`)."""
        return self._scan([DataFile(k, "", None) for k in keys], None)

    def files(self) -> list[DataFile]:
        out = []
        for info in self.store.list(PREFIX, recursive=True):
            m = _FILE.match(info.key[len(PREFIX) + 1 :])
            if not m:
                continue
            job = int(m.group(2)) if m.group(2) else None
            f = _FLUSH.match(m.group(3)) if job is not None else None
            flush = (f.group(1), int(f.group(2)), f.group(3)) if f else None
            out.append(DataFile(info.key, m.group(1), job, flush))
        return out

    def job(self, job_id: int) -> pa.Table:
        """Every row of one job, all its runs, merged."""
        import pyarrow.compute as pc

        return self._read(lambda f: f.job_id in (None, job_id), pc.field("job_id") == job_id)

    def array_task(self, array_job_id: int, array_task_id: int) -> int | None:
        """The job id of array task ``ARRAY_TASK`` (``6_1``), if its records hold it."""
        import pyarrow.compute as pc

        where = (pc.field("array_job_id") == array_job_id) & (
            pc.field("array_task_id") == array_task_id
        )
        ids = self._read(lambda f: True, where, ["job_id"], exact=False)["job_id"]
        return max(ids.to_pylist(), default=None)

    def since(
        self,
        t0: float,
        where: Any = None,
        columns: list[str] | None = None,
        exact: bool = True,
    ) -> pa.Table:
        """Rows in the day partitions that hold runs started at ``t0`` or later (a superset:
        the caller keeps the runs it wants), optionally filtered by ``where``; only
        ``columns`` (the key columns too, if ``exact``) if given.

        ``exact=False`` skips merging rows (the costly part over millions): duplicates
        are then avoided per file (an epilog flush supersedes the node's earlier ones;
        compacted days hold none), which leaves only what a compaction racing this read,
        or a run whose flushes straddle days, may repeat. Aggregates by min/max are
        unaffected either way.
        """
        day0 = time.strftime("%Y-%m-%d", time.gmtime(t0 - 86400))
        return self._read(lambda f: f.day >= day0, where, columns, exact)

    def _read(
        self,
        wanted: Callable[[DataFile], bool],
        where: Any,
        columns: list[str] | None = None,
        exact: bool = True,
    ) -> pa.Table:
        if columns is not None and exact:
            columns = [*KEY, *(c for c in columns if c not in KEY)]
        for attempt in range(2):
            files = [f for f in self.files() if wanted(f)]
            try:
                table = self._scan(files, where, columns, supersede=not exact)
                return self._in_windows(merge(table) if exact else table)
            except FileNotFoundError:
                if attempt:  # compaction moved files twice while we read: say so
                    raise
        raise AssertionError("unreachable")

    def _in_windows(self, table: pa.Table) -> pa.Table:
        """``table`` with each mark kept to its job's window; counts what was not."""
        from bootseer.phases.window import within_windows

        kept = within_windows(table, now=time.time())
        self.marks_dropped += kept.dropped
        self.marks_clipped += kept.clipped
        return kept.table

    def _scan(
        self,
        files: list[DataFile],
        where: Any,
        columns: list[str] | None = None,
        supersede: bool = False,
    ) -> pa.Table:
        """The rows of these files; byte counts a file lacks (written before they
        existed: ``store_bytes``, ``peer_bytes``) read as 0."""
        return fill_counts(self._scan_files(files, where, columns, supersede))

    def _scan_files(
        self,
        files: list[DataFile],
        where: Any,
        columns: list[str] | None = None,
        supersede: bool = False,
    ) -> pa.Table:
        """``supersede``: leave out flushes an epilog flush holds (:func:`superseded`),
        among the files that passed their checks: a forged or unreadable epilog file
        hides no genuine flush."""
        import pyarrow.dataset as pads

        schema = arrow_schema()
        fmt = pads.ParquetFileFormat()
        with cf.ThreadPoolExecutor(max_workers=8) as pool:
            checked = list(pool.map(lambda f: (f, self._fragment(fmt, f.key)), files))
        drop = superseded([f for f, frag in checked if frag is not None]) if supersede else set()
        fragments = [(f.key, frag) for f, frag in checked if frag is not None and f.key not in drop]
        empty = schema.empty_table()
        if columns is not None:
            empty = empty.select(columns)
        if not fragments:
            return empty
        fs = None if self.keys is not None else self.store.fs  # checked: read from memory
        dataset = pads.FileSystemDataset([f for _, f in fragments], schema, fmt, fs)
        try:
            return dataset.to_table(filter=where, columns=columns)
        except FileNotFoundError:
            raise
        except OSError:
            pass  # damaged beyond the footer: read file by file to name the bad one
        import pyarrow as pa

        tables = []
        for key, frag in fragments:
            try:
                tables.append(
                    pads.FileSystemDataset([frag], schema, fmt, fs).to_table(
                        filter=where, columns=columns
                    )
                )
            except FileNotFoundError:
                raise
            except (OSError, pa.ArrowException) as exc:
                path = self.store.path(key)
                self.skipped.add(path)
                self.on_skip(f"skipped {path}: cannot read it ({_short(exc)})")
        return pa.concat_tables(tables) if tables else empty

    def _fragment(self, fmt: pads.ParquetFileFormat, key: str) -> pads.Fragment | None:
        """The file at ``key`` as a fragment to scan, or None (unreadable, not phase
        records, or its seal refused). With a key to check seals, the fragment is the very
        bytes whose seal verified, read into memory: nothing swapped in after the check
        is read."""
        import pyarrow as pa

        path = self.store.path(key)
        try:
            if self.keys is not None:
                raw = self.store.read_bytes(key, limit=MAX_FILE_BYTES + 1)
                sealed = verdict(self.keys, key, raw) if len(raw) <= MAX_FILE_BYTES else "oversize"
                if sealed != "sealed":
                    self._refuse(key, sealed, raw)
                    return None
                frag = fmt.make_fragment(pa.BufferReader(raw))
            else:
                frag = fmt.make_fragment(path, filesystem=self.store.fs)
            physical = frag.physical_schema
        except FileNotFoundError:
            raise
        except (OSError, pa.ArrowException) as exc:
            self.skipped.add(path)
            self.on_skip(f"skipped {path}: not a readable Parquet file ({_short(exc)})")
            return None
        problem = schema_problem(physical)
        if problem:
            self.skipped.add(path)
            self.on_skip(f"skipped {path}: not a phase records file ({problem})")
            return None
        if self.seals is not None and self.keys is None:  # no key: is there a seal at all?
            meta = frag.metadata
            seal = (meta.metadata or {}).get(META_KEY, b"")
            if seal.startswith(MARK):
                self.seals.count(key, "unchecked")
            else:  # counted, and shown as unsealed
                self.seals.count(key, "unsealed", meta.num_rows)
        elif self.seals is not None:
            self.seals.count(key, "sealed")
        return frag

    def _refuse(self, key: str, why: Verdict, raw: bytes) -> None:
        """Count a file whose seal was refused, with its rows as its footer says (best
        effort: the footer of a file nobody vouches for; none for one too large)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        assert self.seals is not None
        try:
            rows = 0 if why == "oversize" else pq.read_metadata(pa.BufferReader(raw)).num_rows
        except (OSError, pa.ArrowException):
            rows = 0
        self.seals.count(key, why, rows)


def _short(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__


def schema_problem(physical: pa.Schema) -> str | None:
    import pyarrow.types as pat

    want = arrow_schema()
    for name, kind in COLUMNS:
        idx = physical.get_field_index(name)
        if idx < 0:
            if name in REQUIRED:
                return f"no column {name!r}"
            continue
        have = physical.field(idx).type
        if kind == "timestamp":
            ok = pat.is_timestamp(have)
        elif kind == "string":
            ok = pat.is_string(have) or pat.is_large_string(have)
        else:
            ok = pat.is_integer(have)
        if not ok:
            return f"column {name!r} is {have}, not {want.field(name).type}"
    return None


def merge(table: pa.Table) -> pa.Table:
    """One row per (job, run, node, phase): rows from several flushes, or duplicates a
    compaction left, become one spanning the earliest start to the latest end, with the
    worst outcome and the largest byte counts. ``table`` may hold a subset of the
    columns, the key among them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return table
    idx = pa.array(range(table.num_rows), pa.int64())
    aggs = [("_idx", "min"), ("_idx", "count")]
    spans = [
        (n, f)
        for n, f in (
            ("start", "min"),
            ("end", "max"),
            ("bytes", "max"),
            ("store_bytes", "max"),
            ("peer_bytes", "max"),
            ("submit_time", "max"),
        )
        if n in table.column_names
    ]
    aggs += spans
    work = table.select([*KEY, *(n for n, _ in spans)]).append_column("_idx", idx)
    if "outcome" in table.column_names:
        work = work.append_column(
            "_rank", pc.index_in(table["outcome"], value_set=pa.array(_OUTCOME_RANK))
        )
        aggs.append(("_rank", "max"))
    grouped = work.group_by(list(KEY)).aggregate(aggs)
    if grouped.num_rows == table.num_rows:
        return table
    first = table.take(grouped["_idx_min"])
    for name, fn in spans:
        first = first.set_column(first.column_names.index(name), name, grouped[f"{name}_{fn}"])
    if "outcome" in table.column_names:
        outcome = pc.take(pa.array(_OUTCOME_RANK), grouped["_rank_max"])
        first = first.set_column(first.column_names.index("outcome"), "outcome", outcome)
    return first
