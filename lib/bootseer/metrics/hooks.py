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

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bootseer import filelock
from bootseer.errors import describe
from bootseer.stepapi import Hook, Outcome

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


# sample name, sorted labels -> value
Key = tuple[str, tuple[tuple[str, str], ...]]


def _key(name: str, **labels: str) -> Key:
    return name, tuple(sorted(labels.items()))


class Tally:
    """The file's samples as numbers; :meth:`render` writes them back in the text format.

    The hooks read and write their own file without ``prometheus_client``: a hook of a
    bootseer job is on its start path, and importing that package (its exposition
    module pulls in ``http.server``, ``ssl``, ``email``) costs tens of milliseconds.
    The subset written here (``# HELP``, ``# TYPE``, ``name{label="value"} number``) is
    what its parser and node_exporter read; the tests parse the file with both.
    """

    def __init__(self, text: str | None = None, families: tuple[Family, ...] = FAMILIES) -> None:
        """``families``: the file's (the hooks' by default; the checkpoint daemons' file
        is kept the same way, :mod:`bootseer.ckptd.metrics`)."""
        self.values: dict[Key, float] = {}
        self.families = families
        names = {f"{f.name}{suffix}": f for f in families for suffix in _SUFFIXES[f.kind]}
        for n, line in enumerate((text or "").splitlines(), start=1):
            if not line or line.startswith("#"):
                continue
            m = _SAMPLE.fullmatch(line)
            if m is None:
                raise ValueError(f"line {n} is not a sample: {line[:80]!r}")
            name, body, value = m.groups()
            labels = dict(_LABEL.findall(body or ""))
            spec = names.get(name)
            if spec is None:
                continue  # a series this version no longer writes
            want = set(spec.labels) | ({"le"} if name.endswith("_bucket") else set())
            if set(labels) == want:
                self.values[(name, tuple(sorted(labels.items())))] = float(value)

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

    def render(self) -> bytes:
        """The text format: each family's HELP and TYPE, then its samples (a histogram's
        buckets in ``le`` order, then its count and sum)."""
        out: list[str] = []
        for spec in self.families:
            name = f"{spec.name}_total" if spec.kind == "counter" else spec.name
            out.append(f"# HELP {name} {_escape_help(spec.help)}")
            out.append(f"# TYPE {name} {spec.kind}")
            if spec.kind != "histogram":
                out += [
                    _line(n, labels, v)
                    for (n, labels), v in sorted(self.values.items())
                    if n == name
                ]
                continue
            for (n, labels), count in sorted(self.values.items()):
                if n != f"{spec.name}_count":
                    continue
                lv = dict(labels)
                for _, le in _LE:
                    key = _key(f"{spec.name}_bucket", le=le, **lv)
                    v = count if le == "+Inf" else self.values.get(key, 0.0)
                    out.append(_line(f"{spec.name}_bucket", key[1], v))
                out.append(_line(n, labels, count))
                out.append(
                    _line(
                        f"{spec.name}_sum",
                        labels,
                        self.values.get(_key(f"{spec.name}_sum", **lv), 0.0),
                    )
                )
        return ("\n".join(out) + "\n").encode()


_SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum")}
_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _line(name: str, labels: tuple[tuple[str, str], ...], value: float) -> str:
    # Label values come from fixed sets of plain words; escaped all the same.
    body = ",".join(
        f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for k, v in labels
    )
    return f"{name}{{{body}}} {value!r}" if body else f"{name} {value!r}"


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
                tally = Tally(read_bounded(path))
            except ValueError as exc:
                log(f"metrics: {exc}; counting afresh")
                tally = Tally()
            tally.add(sample)
            write_atomically(path, tally.render())
    except Exception as exc:
        log(f"metrics not written to {path}: {describe(exc)}")
