"""The phase record: one row per (job, run, node, phase), and the standard phase names.

A row is a :class:`PhaseRow`; a batch of rows becomes an Arrow table with
:func:`to_table`, whose schema (:func:`arrow_schema`) is the dataset's::

    >>> meta = JobMeta(job_id=42, restart_count=0, node="n1", node_count=4, user="ada")
    >>> row = meta.row("ckpt_load", 100.0, 112.5, bytes=2**30)
    >>> row.seconds
    12.5

Times are seconds since the epoch (UTC) in Python and ``timestamp[us, UTC]`` in Parquet.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bootseer.stepapi import OUTCOMES, Outcome

if TYPE_CHECKING:
    import pyarrow as pa

# The phases the Bootseer paper names, marked by the job itself. first_step ends startup.
JOB_PHASES = ("container_start", "deps_install", "ckpt_load", "framework_init", "first_step")
STARTUP_END = "first_step"

# The whole hook is a phase of its own ("prolog", "epilog"), and each of its steps one,
# which the hooks' step table names (bootseer.hooks.steps: prolog "image" is
# image_prefetch; a test holds these tuples and that table together).
IMAGE_PREFETCH, DEPS_RESTORE, CKPT_MOUNT = "image_prefetch", "deps_restore", "ckpt_mount"
IMAGE_TRACE, DEPS_CAPTURE, CKPT_UNMOUNT = "image_trace", "deps_capture", "ckpt_unmount"
PROLOG_PHASES = ("prolog", IMAGE_PREFETCH, DEPS_RESTORE, CKPT_MOUNT)
EPILOG_PHASES = ("epilog", IMAGE_TRACE, DEPS_CAPTURE, CKPT_UNMOUNT)

# Display order; phases not listed follow, by when they started.
PHASE_ORDER = (*PROLOG_PHASES, *JOB_PHASES, *EPILOG_PHASES)
# Phases that belong to the job's end, not to its startup.
TEARDOWN_PHASES = frozenset(EPILOG_PHASES)
# Rows only the hooks (root) write: they bound a job's window (phases.window), so a mark
# by one of these names is not taken (phases.flush).
HOOK_PHASES = (*PROLOG_PHASES, *EPILOG_PHASES)

PHASE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
DETAIL_MAX = 500


def check_phase_name(name: str) -> str:
    """Return ``name`` if it is a valid phase name, else raise ``ValueError``."""
    if not PHASE_NAME.match(name):
        raise ValueError(
            f"invalid phase name {name!r}: want a letter, then up to 63 of [A-Za-z0-9_.-]"
            f" (standard names: {', '.join(JOB_PHASES)})"
        )
    return name


@dataclass(frozen=True)
class PhaseRow:
    job_id: int
    restart_count: int
    job_name: str
    user: str
    account: str
    node: str
    node_count: int
    gpus_per_node: int
    phase: str
    start: float
    end: float
    outcome: Outcome = "ok"
    bytes: int = 0
    store_bytes: int = 0  # of what the phase moved, bytes from the shared store
    peer_bytes: int = 0  # and bytes from the job's other nodes (peer-to-peer)
    detail: str = ""
    submit_time: float | None = None
    # An array task's ``ARRAY_TASK`` (``6_1``: array job 6, task 1; its job id is its own),
    # and the batch script's path: what Slurm's squeue said, None/"" where it did not.
    array_job_id: int | None = None
    array_task_id: int | None = None
    script: str = ""

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PhaseRow:
        """Build a row from :meth:`to_dict` output; raises ``ValueError`` on a bad one."""
        try:
            row = cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})
        except TypeError as exc:
            raise ValueError(f"bad phase row: {exc}") from None
        row.check()
        return row

    def check(self) -> None:
        for name, kind in _PY_TYPES.items():
            value = getattr(self, name)
            if value is None and name in NULLABLE:
                continue
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ValueError(f"bad phase row: {name}={value!r}")
        check_phase_name(self.phase)
        if self.outcome not in OUTCOMES:
            raise ValueError(f"bad phase row: outcome={self.outcome!r}")


_PY_TYPES: dict[str, type | tuple[type, ...]] = {
    "job_id": int,
    "restart_count": int,
    "job_name": str,
    "user": str,
    "account": str,
    "node": str,
    "node_count": int,
    "gpus_per_node": int,
    "phase": str,
    "start": (int, float),
    "end": (int, float),
    "outcome": str,
    "bytes": int,
    "store_bytes": int,
    "peer_bytes": int,
    "detail": str,
    "submit_time": (int, float),
    "array_job_id": int,
    "array_task_id": int,
    "script": str,
}
NULLABLE = ("submit_time", "array_job_id", "array_task_id")


@dataclass(frozen=True)
class JobMeta:
    """What every row of one job run on one node shares."""

    job_id: int
    restart_count: int = 0
    job_name: str = ""
    user: str = ""
    account: str = ""
    node: str = ""
    node_count: int = 1
    gpus_per_node: int = 0
    submit_time: float | None = None
    array_job_id: int | None = None
    array_task_id: int | None = None
    script: str = ""

    def row(
        self,
        phase: str,
        start: float,
        end: float,
        outcome: Outcome = "ok",
        bytes: int = 0,
        detail: str = "",
        *,
        store_bytes: int = 0,
        peer_bytes: int = 0,
    ) -> PhaseRow:
        return PhaseRow(
            job_id=self.job_id,
            restart_count=self.restart_count,
            job_name=self.job_name,
            user=self.user,
            account=self.account,
            node=self.node,
            node_count=self.node_count,
            gpus_per_node=self.gpus_per_node,
            phase=phase,
            start=float(start),
            end=float(end),
            outcome=outcome,
            bytes=int(bytes),
            store_bytes=int(store_bytes),
            peer_bytes=int(peer_bytes),
            detail=detail[:DETAIL_MAX],
            submit_time=self.submit_time,
            array_job_id=self.array_job_id,
            array_task_id=self.array_task_id,
            script=self.script,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobMeta:
        names = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in names})
        except TypeError as exc:
            raise ValueError(f"bad job metadata: {exc}") from None


# Column name -> Arrow type name; the order is the file's column order.
COLUMNS = (
    ("job_id", "int64"),
    ("restart_count", "int32"),
    ("job_name", "string"),
    ("user", "string"),
    ("account", "string"),
    ("node", "string"),
    ("node_count", "int32"),
    ("gpus_per_node", "int32"),
    ("phase", "string"),
    ("start", "timestamp"),
    ("end", "timestamp"),
    ("outcome", "string"),
    ("bytes", "int64"),
    ("store_bytes", "int64"),
    ("peer_bytes", "int64"),
    ("detail", "string"),
    ("submit_time", "timestamp"),
    ("array_job_id", "int64"),
    ("array_task_id", "int64"),
    ("script", "string"),
)
REQUIRED = ("job_id", "restart_count", "node", "phase", "start", "end", "outcome")
# Counts a file written before they existed lacks: read as 0.
COUNTS = ("bytes", "store_bytes", "peer_bytes")


def arrow_type(name: str) -> pa.DataType:
    import pyarrow as pa

    if name == "timestamp":
        return pa.timestamp("us", tz="UTC")
    return pa.type_for_alias(name)


def arrow_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            pa.field(n, arrow_type(t), nullable=(n in NULLABLE or n not in REQUIRED))
            for n, t in COLUMNS
        ]
    )


def to_table(rows: list[PhaseRow]) -> pa.Table:
    """Rows -> an Arrow table with :func:`arrow_schema`."""
    import pyarrow as pa

    schema = arrow_schema()
    arrays = []
    for name, kind in COLUMNS:
        values = [getattr(r, name) for r in rows]
        if kind == "timestamp":
            # Microseconds straight into the timestamp type: a cast from int64 would load
            # pyarrow.compute (0.04 CPU-s) in every hook and flush that writes rows.
            micros = [None if v is None else round(v * 1_000_000) for v in values]
            arrays.append(pa.array(micros, schema.field(name).type))
        else:
            arrays.append(pa.array(values, schema.field(name).type))
    return pa.Table.from_arrays(arrays, schema=schema)


def fill_counts(table: pa.Table) -> pa.Table:
    """``table`` with nulls in its byte counts as 0 (what a file without them means)."""
    import pyarrow.compute as pc

    for name in COUNTS:
        if name in table.column_names and table.column(name).null_count:
            idx = table.column_names.index(name)
            table = table.set_column(idx, name, pc.fill_null(table.column(name), 0))
    return table


def from_table(table: pa.Table) -> list[PhaseRow]:
    """An Arrow table with the dataset's columns -> rows (times back to epoch seconds)."""
    table = fill_counts(table)
    cols: dict[str, list[Any]] = {}
    for name, kind in COLUMNS:
        col = table.column(name)
        if kind == "timestamp":
            import pyarrow as pa

            col = col.cast(pa.int64())
            cols[name] = [None if v is None else v / 1_000_000 for v in col.to_pylist()]
        else:
            cols[name] = col.to_pylist()
            if kind == "string":  # a file from before the column existed: empty
                cols[name] = ["" if v is None else v for v in cols[name]]
    return [PhaseRow(**{n: cols[n][i] for n, _ in COLUMNS}) for i in range(table.num_rows)]
