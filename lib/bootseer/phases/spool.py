"""A job's phase spool on one node: ``<run_dir>/phases/<job_id>/`` (:mod:`bootseer.nodepaths`).

Rows wait here, node-local and cheap to append, until a flush writes them to the
store as one Parquet file (:mod:`bootseer.phases.flush`):

- ``job.json`` (root's alone, like the directory's listing): what every row of this run
  on this node shares (:class:`JobMeta`).
- ``rows.jsonl`` (root's alone): the prolog's rows, one JSON object a line.
- ``marks.jsonl`` (the job user's, mode 0600, in a directory only root may change):
  the job's own ``start``/``end`` marks, appended by :mod:`bootseer.phases.marks`.

The prolog makes the spool a tmpfs of its own, sized to the marks cap
(:meth:`Spool.create` with ``cap``): the user's marks file can fill that, never the
node's run_dir (``/run``, where slurmd, munge and every other job's files live).

The spool lives beside the job directory, not in it, so the epilog can still read it
after the hook runner has removed the job directory. Marks come from the user and are
untrusted: they are read without following links, up to a size cap, line by line,
and a bad line is counted, never trusted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bootseer import jsonlimits, localrecord, mounts, nodepaths
from bootseer.phases.schema import (
    DETAIL_MAX,
    PHASE_NAME,
    JobMeta,
    PhaseRow,
)
from bootseer.stepapi import OUTCOMES, Outcome

if TYPE_CHECKING:
    from bootseer.phases.marks import Event

MARKS_FILE = "marks.jsonl"
ROWS_FILE = "rows.jsonl"
META_FILE = "job.json"
ROOM = 1 << 20  # the spool's tmpfs holds job.json and rows.jsonl (root's) besides the marks
STALE_SECONDS = 14 * 24 * 3600  # a spool whose epilog never ran (node crash) goes after this


@dataclass(frozen=True)
class MarkEvent:
    event: Event
    phase: str
    time: float
    task: str  # "<step>.<rank>": pairs a start with its end when many ranks mark
    outcome: Outcome = "ok"
    bytes: int = 0
    detail: str = ""
    store_bytes: int = 0
    peer_bytes: int = 0


class Spool:
    def __init__(self, run_dir: Path, job_id: int) -> None:
        self.path = nodepaths.spool_dir(run_dir, job_id)

    @classmethod
    def at(cls, path: Path) -> Spool:
        spool = cls.__new__(cls)
        spool.path = path
        return spool

    @property
    def marks_path(self) -> Path:
        return self.path / MARKS_FILE

    def exists(self) -> bool:
        return (self.path / META_FILE).exists()

    def create(self, meta: JobMeta, uid: int, gid: int, cap: int | None = None) -> None:
        """A fresh spool for one run: an earlier run's leftovers go first. With ``cap``
        (the marks cap, in bytes), the spool is a tmpfs of ``cap`` plus room for root's
        files, so a job that writes its marks file without end fills only that."""
        # <run_dir>/phases only root may write, whatever the umask (nodepaths.root_only_dir).
        nodepaths.root_only_dir(self.path.parent.parent, sticky_ok=True, follow=True)
        nodepaths.root_only_dir(self.path.parent)
        self.remove()
        self.path.mkdir(mode=0o711)
        if cap is not None and os.geteuid() == 0:
            # Not mounted (no tmpfs in a container without CAP_SYS_ADMIN): a plain directory.
            with contextlib.suppress(OSError):
                mounts.mount_tmpfs(self.path, cap + ROOM)
        # Whatever the umask: the job's user reaches her marks file by name, and no user
        # lists the spool or reads root's files in it (which jobs run here, and their
        # phases, where the site keeps phases private: issue 21 item 6).
        os.chmod(self.path, 0o711)
        self.write_meta(meta)
        fd = os.open(self.marks_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.fchown(fd, uid, gid)
        finally:
            os.close(fd)

    def write_meta(self, meta: JobMeta) -> None:
        _write_atomic(self.path / META_FILE, json.dumps(meta.to_dict()))

    def meta(self) -> JobMeta:
        raw = (self.path / META_FILE).read_bytes()
        return JobMeta.from_dict(jsonlimits.loads(raw, what=META_FILE))

    def append_rows(self, rows: list[PhaseRow]) -> None:
        text = "".join(json.dumps(r.to_dict()) + "\n" for r in rows)
        fd = os.open(
            self.path / ROWS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600
        )
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def hook_rows(self) -> list[PhaseRow]:
        try:
            text = (self.path / ROWS_FILE).read_text()
        except FileNotFoundError:
            return []
        rows = []
        for line in text.splitlines():
            with contextlib.suppress(ValueError):  # a torn last line after a crash
                rows.append(PhaseRow.from_dict(jsonlimits.loads(line, what="phase row")))
        return rows

    def marks(self, max_bytes: int) -> tuple[list[MarkEvent], list[str]]:
        """The job's marks, and what was wrong with the lines that were not marks."""
        problems: list[str] = []
        try:
            fd = os.open(self.marks_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return [], []
        except OSError as exc:
            return [], [f"cannot read {self.marks_path}: {exc.strerror}"]
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return [], [f"{self.marks_path} is not a regular file"]
            data = os.pread(fd, max_bytes + 1, 0)
        finally:
            os.close(fd)
        if len(data) > max_bytes:
            problems.append(f"marks beyond the first {max_bytes} bytes ignored")
            data = data[: data.rfind(b"\n", 0, max_bytes) + 1]
        events = []
        bad = 0
        for line in data.splitlines():
            try:
                events.append(parse_mark(jsonlimits.loads(line, what="mark")))
            except (ValueError, TypeError, KeyError, AttributeError):
                bad += 1
        if bad:
            problems.append(f"{bad} unreadable mark line(s) ignored")
        return events, problems

    def remove(self) -> None:
        _remove(self.path)


def parse_mark(data: Any) -> MarkEvent:
    event = data["ev"]
    phase = data["phase"]
    when = data["t"]
    outcome = data.get("outcome", "ok")
    detail = data.get("detail", "")
    nbytes = data.get("bytes", 0)
    store_bytes = data.get("store_bytes", 0)
    peer_bytes = data.get("peer_bytes", 0)
    task = data.get("task", "")
    counts = (nbytes, store_bytes, peer_bytes)
    if (
        event not in ("start", "end")
        or not isinstance(phase, str)
        or not PHASE_NAME.match(phase)
        or not isinstance(when, int | float)
        or isinstance(when, bool)
        or not 0 < when < 1e11
        or outcome not in OUTCOMES
        or not isinstance(detail, str)
        or any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in counts)
        or not isinstance(task, str)
    ):
        raise ValueError("not a mark")
    return MarkEvent(
        event,
        phase,
        float(when),
        task[:64],
        outcome,
        nbytes,
        detail[:DETAIL_MAX],
        store_bytes,
        peer_bytes,
    )


def rows_from_marks(
    events: list[MarkEvent], meta: JobMeta, final: bool, now: float | None = None
) -> list[PhaseRow]:
    """Pair starts with ends into one row per phase for this node.

    Each end closes the earliest open start of the same phase in the same task (rank),
    or failing that in any task. A node's row spans its ranks: the first start to the
    last end, failed if any rank failed. An end without a start is a point in time.
    A start without an end is left for a later flush, or on the final flush (the
    epilog: the job is over) written as failed, ending now.
    """
    now = time.time() if now is None else now
    open_starts: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    spans: dict[str, list[tuple[float, float, MarkEvent]]] = defaultdict(list)
    for ev in sorted(events, key=lambda e: e.time):
        starts = open_starts[ev.phase]
        if ev.event == "start":
            starts[ev.task].append(ev.time)
            continue
        queue = starts.get(ev.task) or next((q for q in starts.values() if q), None)
        begin = queue.pop(0) if queue else ev.time
        spans[ev.phase].append((begin, ev.time, ev))
    rows = []
    for phase, intervals in spans.items():
        begin = min(b for b, _, _ in intervals)
        end = max(e for _, e, _ in intervals)
        worst = max((ev.outcome for _, _, ev in intervals), key=OUTCOME_RANK.__getitem__)
        nbytes = sum(ev.bytes for _, _, ev in intervals)
        store_bytes = sum(ev.store_bytes for _, _, ev in intervals)
        peer_bytes = sum(ev.peer_bytes for _, _, ev in intervals)
        details = [ev.detail for _, _, ev in intervals if ev.detail]
        if len(intervals) > 1:
            details.insert(0, f"{len(intervals)} marks")
        unended = sum(len(q) for q in open_starts[phase].values())
        if final and unended:
            worst = "failed"
            details.insert(0, f"{unended} start(s) never ended")
        rows.append(
            meta.row(
                phase,
                begin,
                end,
                worst,
                nbytes,
                "; ".join(details),
                store_bytes=store_bytes,
                peer_bytes=peer_bytes,
            )
        )
    if final:
        for phase, starts in open_starts.items():
            pending = [t for q in starts.values() for t in q]
            if pending and phase not in spans:
                rows.append(
                    meta.row(phase, min(pending), now, "failed", detail="started but never ended")
                )
    return sorted(rows, key=lambda r: (r.start, r.phase))


# A node's phase is as bad as its worst rank.
OUTCOME_RANK: dict[Outcome, int] = {"skipped": 0, "ok": 1, "timed_out": 2, "failed": 3}


def remove_stale(run_dir: Path, keep: int, now: float | None = None) -> None:
    """Drop spools left by epilogs that never ran (the node went down mid-job)."""
    now = time.time() if now is None else now
    base = nodepaths.spools(run_dir)
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(base):
            if entry.name == str(keep) or not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if now - entry.stat(follow_symlinks=False).st_mtime > STALE_SECONDS:
                    _remove(Path(entry.path))


def _remove(path: Path) -> None:
    """The spool and, first, its tmpfs (lazily: a task may still hold the marks file)."""
    if mounts.is_mounted(path):
        with contextlib.suppress(OSError):
            mounts.umount(path, lazy=True)
    shutil.rmtree(path, ignore_errors=True)


def _write_atomic(path: Path, text: str) -> None:
    localrecord.write_bytes(path, text.encode(), 0o600)
