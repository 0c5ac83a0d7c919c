"""The hooks' metrics: every prolog and epilog run adds to ``bootseer_hooks.prom``.

A hook is a process per job, so its counters live in the file itself: each run takes
the directory's lock (``.bootseer_hooks.lock``, flock), reads the file, adds its own
sample and writes the file anew (:func:`~bootseer.metrics.textfile.write_atomically`).
Both hooks share one file: a family split over two files needs node_exporter to merge
them, and one lock held for a few milliseconds per run costs nothing. A file that is
not ours to parse starts the counts afresh (Prometheus' ``rate()`` takes a reset)::

    >>> record(Path("/srv/textfile"), HookSample("prolog", "ok", 1.5), print)  # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bootseer import filelock
from bootseer.errors import describe
from bootseer.metrics.families import Family, Tally
from bootseer.stepapi import Hook, Outcome

FILE = "bootseer_hooks.prom"
LOCK = ".bootseer_hooks.lock"
LOCK_WAIT = 2.0  # seconds a hook waits for another's write; then it gives its sample up
# Seconds; from a no-op hook (tens of ms) to a cold 25 GB image's prefetch.
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

FAMILIES = (
    Family(
        "bootseer_hook_runs",
        "counter",
        "Prolog and epilog runs of jobs that asked for bootseer, by outcome: ok, failed (a "
        "step failed or timed out), config_error (the site config is unusable: no step ran)",
        ("hook", "outcome"),
    ),
    Family(
        "bootseer_hook_seconds",
        "histogram",
        "Duration of a prolog or epilog run, Python's start-up included",
        ("hook",),
        BUCKETS,
    ),
    Family(
        "bootseer_hook_last_run_timestamp_seconds",
        "gauge",
        "When the hook last ran on this node (Unix time)",
        ("hook",),
    ),
    Family(
        "bootseer_hook_config_error",
        "gauge",
        "1 if the hook's last run found the site config unusable (the job started without "
        "bootseer; bootseer report shows the problem as a site_config phase)",
        ("hook",),
    ),
    Family(
        "bootseer_step_outcomes",
        "counter",
        "Hook steps by outcome (ok, failed, skipped, timed_out); step: image, deps, ckpt",
        ("hook", "step", "outcome"),
    ),
    Family(
        "bootseer_step_seconds",
        "histogram",
        "Duration of a hook step: prolog image is the hot-set prefetch, prolog deps the "
        "snapshot restore, prolog ckpt the mount; epilog: trace, capture, unmount",
        ("hook", "step"),
        BUCKETS,
    ),
    Family(
        "bootseer_hook_records_refused",
        "counter",
        "Store records (snapshot refs and manifests, image records, checkpoint manifests) "
        "the hook refused because their MAC does not verify under the site key, by purpose",
        ("hook", "purpose"),
    ),
    Family(
        "bootseer_phase_bytes",
        "counter",
        "Bytes a hook phase moved (as bootseer report's bytes column)",
        ("phase",),
    ),
    Family(
        "bootseer_phase_source_bytes",
        "counter",
        "Of a hook phase's bytes: those from the shared store and those from the job's "
        "other nodes (peer-to-peer)",
        ("phase", "source"),
    ),
)


@dataclass(frozen=True)
class StepSample:
    step: str
    outcome: Outcome
    seconds: float


@dataclass(frozen=True)
class BytesSample:
    phase: str
    bytes: int
    store_bytes: int
    peer_bytes: int


@dataclass(frozen=True)
class HookSample:
    """What one hook run adds to the node's counts."""

    hook: Hook
    # failed: a step failed or timed out; config_error: the site config is unusable
    outcome: Literal["ok", "failed", "config_error"]
    seconds: float
    steps: tuple[StepSample, ...] = ()
    moved: tuple[BytesSample, ...] = ()
    # Sealed records refused by purpose (bootseer.sitekey.refused of the hook's process).
    refused: tuple[tuple[str, int], ...] = ()
    when: float = field(default_factory=time.time)


def add(tally: Tally, s: HookSample) -> None:
    """Count one hook run into ``tally`` (a file of :data:`FAMILIES`)."""
    tally.inc("bootseer_hook_runs_total", hook=s.hook, outcome=s.outcome)
    tally.observe("bootseer_hook_seconds", s.seconds, hook=s.hook)
    tally.set("bootseer_hook_last_run_timestamp_seconds", s.when, hook=s.hook)
    tally.set("bootseer_hook_config_error", float(s.outcome == "config_error"), hook=s.hook)
    for st in s.steps:
        tally.inc("bootseer_step_outcomes_total", hook=s.hook, step=st.step, outcome=st.outcome)
        tally.observe("bootseer_step_seconds", st.seconds, hook=s.hook, step=st.step)
    for purpose, n in s.refused:
        tally.inc("bootseer_hook_records_refused_total", n, hook=s.hook, purpose=purpose)
    for b in s.moved:
        tally.inc("bootseer_phase_bytes_total", b.bytes, phase=b.phase)
        tally.inc("bootseer_phase_source_bytes_total", b.store_bytes, phase=b.phase, source="store")
        tally.inc("bootseer_phase_source_bytes_total", b.peer_bytes, phase=b.phase, source="peer")


def record(
    directory: Path | None,
    sample: HookSample,
    log: Callable[[str], object],
    wait: float = LOCK_WAIT,
) -> None:
    """Add ``sample`` to ``directory``'s hooks file (None: metrics are off). Never
    raises: metrics are worth a log line, never a failed hook."""
    if directory is None:
        return
    from bootseer.metrics.textfile import read_bounded, write_atomically

    path = directory / FILE
    try:
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        with filelock.held(directory / LOCK, wait, poll=0.005):
            try:
                tally = Tally(FAMILIES, read_bounded(path))
            except ValueError as exc:
                log(f"metrics: {exc}; counting afresh")
                tally = Tally(FAMILIES)
            add(tally, sample)
            write_atomically(path, tally.render())
    except Exception as exc:
        log(f"metrics not written to {path}: {describe(exc)}")
