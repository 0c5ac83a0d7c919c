"""The hooks' metrics: every prolog and epilog run adds to ``bootseer_hooks.prom``.

A hook is a process per job, so its counters live in the file itself: each run takes
the directory's lock (``.bootseer_hooks.lock``, flock), reads the file, adds its own
sample and writes the file anew (:func:`~bootseer.metrics.textfile.write_textfile`).
Both hooks share one file: a family split over two files needs node_exporter to merge
them, and one lock held for a few milliseconds per run costs nothing. A file that is
not ours to parse starts the counts afresh (Prometheus' ``rate()`` takes a reset)::

    >>> record(Path("/srv/textfile"), HookSample("prolog", "ok", 1.5), print)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from bootseer.hooks.runner import HookRun

FILE = "bootseer_hooks.prom"
LOCK = ".bootseer_hooks.lock"
LOCK_WAIT = 2.0  # seconds a hook waits for another's write; then it gives its sample up
# Seconds; from a no-op hook (tens of ms) to a cold 25 GB image's prefetch.
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# Their ``le`` labels, as prometheus_client writes them.
_LE = (*((b, repr(b)) for b in BUCKETS), (float("inf"), "+Inf"))


@dataclass(frozen=True)
class Family:
    name: str  # a counter's without its _total
    kind: str  # counter, gauge, histogram
    help: str
    labels: tuple[str, ...]


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
    outcome: str
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

    hook: str  # prolog, epilog
    outcome: str  # ok, failed, config_error
    seconds: float
    steps: tuple[StepSample, ...] = ()
    moved: tuple[BytesSample, ...] = ()
    # Sealed records refused by purpose (bootseer.sitekey.refused of the hook's process).
    refused: tuple[tuple[str, int], ...] = ()
    when: float = field(default_factory=time.time)

    @classmethod
    def of_run(cls, hook: str, run: HookRun, seconds: float) -> HookSample:
        """The sample of one run of the hook runner (:mod:`bootseer.hooks.runner`)."""
        return cls(
            hook,
            "failed" if run.failed else "ok",
            seconds,
            tuple(StepSample(o.step, o.outcome, o.seconds) for o in run.outcomes),
            tuple(
                BytesSample(r.phase, r.bytes, r.store_bytes, r.peer_bytes)
                for o in run.outcomes
                for r in o.phase_rows()
            ),
        )


# sample name, sorted labels -> value
Key = tuple[str, tuple[tuple[str, str], ...]]


def _key(name: str, **labels: str) -> Key:
    return name, tuple(sorted(labels.items()))


class Tally:
    """The file's samples as numbers, and a :class:`Collector` that writes them back."""

    def __init__(self, families: list[Metric] | None = None) -> None:
        self.values: dict[Key, float] = {}
        ours = {f.name: f for f in FAMILIES}
        for fam in families or []:
            spec = ours.get(fam.name)
            if spec is None:
                continue
            for s in fam.samples:
                if s.name.endswith("_created"):
                    continue
                want = set(spec.labels) | ({"le"} if s.name.endswith("_bucket") else set())
                if set(s.labels) == want:
                    self.values[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        k = _key(name, **labels)
        self.values[k] = self.values.get(k, 0.0) + amount

    def set(self, name: str, value: float, **labels: str) -> None:
        self.values[_key(name, **labels)] = value

    def observe(self, name: str, value: float, **labels: str) -> None:
        for bound, le in _LE:
            self.inc(f"{name}_bucket", 1.0 if value <= bound else 0.0, le=le, **labels)
        self.inc(f"{name}_count", 1.0, **labels)
        self.inc(f"{name}_sum", value, **labels)

    def add(self, s: HookSample) -> None:
        self.inc("bootseer_hook_runs_total", hook=s.hook, outcome=s.outcome)
        self.observe("bootseer_hook_seconds", s.seconds, hook=s.hook)
        self.set("bootseer_hook_last_run_timestamp_seconds", s.when, hook=s.hook)
        self.set("bootseer_hook_config_error", float(s.outcome == "config_error"), hook=s.hook)
        for st in s.steps:
            self.inc("bootseer_step_outcomes_total", hook=s.hook, step=st.step, outcome=st.outcome)
            self.observe("bootseer_step_seconds", st.seconds, hook=s.hook, step=st.step)
        for purpose, n in s.refused:
            self.inc("bootseer_hook_records_refused_total", n, hook=s.hook, purpose=purpose)
        for b in s.moved:
            self.inc("bootseer_phase_bytes_total", b.bytes, phase=b.phase)
            self.inc(
                "bootseer_phase_source_bytes_total", b.store_bytes, phase=b.phase, source="store"
            )
            self.inc(
                "bootseer_phase_source_bytes_total", b.peer_bytes, phase=b.phase, source="peer"
            )

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        for spec in FAMILIES:
            fam: CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily
            if spec.kind == "histogram":
                fam = HistogramMetricFamily(spec.name, spec.help, labels=spec.labels)
                for (name, labels), count in sorted(self.values.items()):
                    if name != f"{spec.name}_count":
                        continue
                    lv = dict(labels)
                    buckets = [
                        (le, self.values.get(_key(f"{spec.name}_bucket", le=le, **lv), 0.0))
                        for _, le in _LE
                    ]
                    buckets[-1] = ("+Inf", count)
                    fam.add_metric(
                        [lv[n] for n in spec.labels],
                        buckets,
                        self.values.get(_key(f"{spec.name}_sum", **lv), 0.0),
                    )
            else:
                sample = f"{spec.name}_total" if spec.kind == "counter" else spec.name
                cls = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
                fam = cls(spec.name, spec.help, labels=spec.labels)
                for (name, labels), value in sorted(self.values.items()):
                    if name == sample:
                        lv = dict(labels)
                        fam.add_metric([lv[n] for n in spec.labels], value)
            yield fam


@contextlib.contextmanager
def _locked(path: Path, wait: float) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{path} held by another hook for {wait:g}s") from None
                time.sleep(0.005)
        yield
    finally:
        os.close(fd)  # releases the lock


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
    from bootseer.metrics.textfile import read_textfile, write_textfile

    path = directory / FILE
    try:
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        with _locked(directory / LOCK, wait):
            try:
                tally = Tally(read_textfile(path))
            except ValueError as exc:
                log(f"metrics: {exc}; counting afresh")
                tally = Tally()
            tally.add(sample)
            write_textfile(path, tally)
    except Exception as exc:
        log(f"metrics not written to {path}: {exc}")
