"""The checkpoint mount daemons' metrics: every daemon of the node adds to ``bootseer_ckpt.prom``.

A daemon serves one job's mount on one node, so several run at once and each ends with
its job. One file per daemon would need a label naming it (the job: unbounded, and no
job id is a label here) or the same series in several files, which node_exporter
refuses; and counts kept only until the epilog merged them would show a job of days
as one jump at its end. So each daemon adds what it moved since its last write to one
shared file, every ``[metrics] interval`` seconds and when it stops, as the hooks do
theirs (:class:`~bootseer.metrics.families.Tally`: the directory's lock
``.bootseer_ckpt.lock``, read, add, write whole by a rename). A write that cannot take
the lock within a second is given up and its increments carried to the next; a daemon
killed outright loses at most one interval's. The counters live in the file, across
daemons; they reset (``rate()`` takes it) when the directory is emptied::

    >>> m = CkptMetrics.start(cfg, fs.counts, log)  # None when metrics are off  # doctest: +SKIP
    >>> m.stop()  # the last increments, at unmount  # doctest: +SKIP
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from bootseer.ckptd.counts import REFUSALS, MountCounts
from bootseer.errors import describe
from bootseer.metrics.families import Family, Key, Tally, key

if TYPE_CHECKING:
    from bootseer.config import SiteConfig

FILE = "bootseer_ckpt.prom"
LOCK = ".bootseer_ckpt.lock"
LOCK_WAIT = 1.0

FAMILIES = (
    Family("bootseer_ckpt_mounts", "counter", "Checkpoint mounts served (a daemon started)", ()),
    Family("bootseer_ckpt_read_bytes", "counter", "Bytes jobs read through checkpoint mounts", ()),
    Family(
        "bootseer_ckpt_written_bytes",
        "counter",
        "Bytes jobs wrote into checkpoint mounts",
        (),
    ),
    Family(
        "bootseer_ckpt_versions",
        "counter",
        "New file versions: committed (closed or fsynced whole), dropped (the writer died, "
        "a write failed, still open at unmount)",
        ("result",),
    ),
    Family(
        "bootseer_ckpt_unit_bytes",
        "counter",
        "Checkpoint units the mounts read, by source: store (the targets), peer (the job's "
        "other nodes)",
        ("source",),
    ),
    Family(
        "bootseer_ckpt_verification_failures",
        "counter",
        "Units refused because their checksum is not the manifest's (the job's read got EIO)",
        (),
    ),
    Family(
        "bootseer_ckpt_manifests_refused",
        "counter",
        "Checkpoint manifests refused because their MAC does not verify under the site key",
        (),
    ),
    Family(
        "bootseer_ckpt_refused_calls",
        "counter",
        "Calls a mount refused, by reason: name, not_permitted (its log file, links), "
        "append, quota (EDQUOT), stage_full (node-local staging, ENOSPC)",
        ("reason",),
    ),
    Family(
        "bootseer_ckpt_io_errors",
        "counter",
        "Calls a mount answered with EIO (a target failed, a unit was missing or corrupt)",
        (),
    ),
    Family(
        "bootseer_ckpt_staged_bytes",
        "counter",
        "Bytes written out of order into node-local staging ([ckpt] stage_bytes)",
        (),
    ),
)


def samples(c: MountCounts, started: bool = True) -> dict[Key, float]:
    """What one daemon's mount has done so far (``c``), as the file's samples."""
    out = {
        key("bootseer_ckpt_mounts_total"): float(started),
        key("bootseer_ckpt_read_bytes_total"): c.bytes_read,
        key("bootseer_ckpt_written_bytes_total"): c.bytes_written,
        key("bootseer_ckpt_versions_total", result="committed"): c.committed,
        key("bootseer_ckpt_versions_total", result="dropped"): c.dropped,
        key("bootseer_ckpt_unit_bytes_total", source="store"): c.store_bytes,
        key("bootseer_ckpt_unit_bytes_total", source="peer"): c.peer_bytes,
        key("bootseer_ckpt_verification_failures_total"): c.corrupt_units,
        key("bootseer_ckpt_manifests_refused_total"): c.manifests_refused,
        key("bootseer_ckpt_io_errors_total"): c.io_errors,
        key("bootseer_ckpt_staged_bytes_total"): c.staged_bytes,
    }
    for reason in REFUSALS:
        out[key("bootseer_ckpt_refused_calls_total", reason=reason)] = c.refused.get(reason, 0)
    return {k: float(v) for k, v in out.items()}


class CkptMetrics:
    """Adds one daemon's increments to the node's file, in a thread of its own."""

    def __init__(
        self,
        directory: Path,
        interval: float,
        counts: Callable[[], MountCounts],
        log: Callable[[str], object],
    ) -> None:
        """``counts``: the mount's counters as they are now (:meth:`CkptFS.counts`)."""
        self.dir = directory
        self.interval = interval
        self.counts = counts
        self.log = log
        self.added: dict[Key, float] = {}  # what this daemon has put into the file
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ckpt-metrics", daemon=True)
        self._failing = False

    @classmethod
    def start(
        cls, cfg: SiteConfig, counts: Callable[[], MountCounts], log: Callable[[str], object]
    ) -> CkptMetrics | None:
        if cfg.metrics.textfile_dir is None:
            return None
        m = cls(cfg.metrics.textfile_dir, cfg.metrics.interval, counts, log)
        m.flush()
        m._thread.start()
        return m

    def flush(self, wait: float = LOCK_WAIT) -> bool:
        """Add what changed since the last write; False (kept for the next) if it could
        not be written. Never raises: metrics never fail a job's mount."""
        from bootseer import filelock
        from bootseer.metrics.textfile import read_bounded, write_atomically

        now = samples(self.counts())
        delta = {k: v - self.added.get(k, 0.0) for k, v in now.items()}
        path = self.dir / FILE
        try:
            self.dir.mkdir(mode=0o755, parents=True, exist_ok=True)
            with filelock.held(self.dir / LOCK, wait, poll=0.005):
                try:
                    tally = Tally(FAMILIES, read_bounded(path))
                except ValueError as exc:
                    self.log(f"metrics: {exc}; counting afresh")
                    tally = Tally(FAMILIES)
                for (name, labels), v in delta.items():
                    tally.inc(name, v, **dict(labels))
                write_atomically(path, tally.render())
        except Exception as exc:
            if not self._failing:
                self.log(f"metrics not written to {path}: {describe(exc)}")
            self._failing = True
            return False
        self._failing = False
        self.added = now
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.flush()

    def stop(self) -> None:
        """Stop the thread and write the last increments (waiting a little longer)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.flush(wait=3 * LOCK_WAIT)
