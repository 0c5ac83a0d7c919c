"""A ``.prom`` file of counters that several processes add to: its families and its samples.

The hooks (one process per job, :mod:`bootseer.metrics.hooks`) and the checkpoint mount
daemons (several per node, :mod:`bootseer.ckptd.metrics`) keep their counts in the file
itself: each takes the directory's lock, reads the file into a :class:`Tally`, adds its
own increments and writes it whole again. A :class:`Family` declares one metric: its
name, kind, help and label names (the whole set the file may hold)::

    >>> runs = Family("demo_runs", "counter", "Demo runs", ("outcome",))
    >>> t = Tally((runs,))
    >>> t.inc("demo_runs_total", outcome="ok")
    >>> print(Tally((runs,), t.render().decode()).render().decode(), end="")
    # HELP demo_runs_total Demo runs
    # TYPE demo_runs_total counter
    demo_runs_total{outcome="ok"} 1.0
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["counter", "gauge", "histogram"]

# sample name, sorted labels -> value
Key = tuple[str, tuple[tuple[str, str], ...]]


def key(name: str, **labels: str) -> Key:
    """The sample ``name{labels}`` as a :class:`Tally` keeps it."""
    return name, tuple(sorted(labels.items()))


@dataclass(frozen=True)
class Family:
    name: str  # a counter's without its _total
    kind: Kind
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()  # a histogram's upper bounds; +Inf is added

    @property
    def le(self) -> tuple[tuple[float, str], ...]:
        """A histogram's bounds with their ``le`` labels, as prometheus_client writes them."""
        return (*((b, repr(b)) for b in self.buckets), (float("inf"), "+Inf"))


class Tally:
    """The file's samples as numbers; :meth:`render` writes them back in the text format.

    A hook reads and writes its file without ``prometheus_client``: a hook of a
    bootseer job is on its start path, and importing that package (its exposition
    module pulls in ``http.server``, ``ssl``, ``email``) costs tens of milliseconds.
    The subset written here (``# HELP``, ``# TYPE``, ``name{label="value"} number``) is
    what its parser and node_exporter read; the tests parse the file with both.
    """

    def __init__(self, families: tuple[Family, ...], text: str | None = None) -> None:
        """``families``: the file's; ``text``: what it holds (samples of series no
        family declares, or with other labels, are left out)."""
        self.values: dict[Key, float] = {}
        self.families = families
        self._histograms = {f.name: f for f in families if f.kind == "histogram"}
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
        k = key(name, **labels)
        self.values[k] = self.values.get(k, 0.0) + amount

    def set(self, name: str, value: float, **labels: str) -> None:
        self.values[key(name, **labels)] = value

    def observe(self, name: str, value: float, **labels: str) -> None:
        """One observation of the histogram ``name`` (a family of this file's)."""
        for bound, le in self._histograms[name].le:
            self.inc(f"{name}_bucket", 1.0 if value <= bound else 0.0, le=le, **labels)
        self.inc(f"{name}_count", 1.0, **labels)
        self.inc(f"{name}_sum", value, **labels)

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
                for _, le in spec.le:
                    k = key(f"{spec.name}_bucket", le=le, **lv)
                    v = count if le == "+Inf" else self.values.get(k, 0.0)
                    out.append(_line(f"{spec.name}_bucket", k[1], v))
                out.append(_line(n, labels, count))
                out.append(
                    _line(
                        f"{spec.name}_sum",
                        labels,
                        self.values.get(key(f"{spec.name}_sum", **lv), 0.0),
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
