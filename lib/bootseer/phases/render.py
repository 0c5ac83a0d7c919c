"""Terminal rendering of reports with rich: tables, and a per-node timeline (Gantt bars).

Job names, users, accounts, phase names, outcomes and node names come from the job or
from rows in the store, so every one of them is escaped (``esc``) or put in a ``Text``
before rich sees it: a job named ``[/]`` must neither restyle the report nor crash it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from bootseer.phases.report import JobReport, RunReport, phase_sort_key
from bootseer.phases.schema import STARTUP_END
from bootseer.phases.startup import in_startup

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from bootseer.phases.cluster import ClusterReport

PALETTE = (
    "cyan",
    "green",
    "yellow",
    "magenta",
    "blue",
    "red",
    "bright_cyan",
    "bright_green",
    "bright_yellow",
    "bright_magenta",
    "bright_blue",
    "bright_red",
)


def esc(value: object) -> str:
    """``value`` as text that rich shows as it is (no markup)."""
    from rich.markup import escape

    return escape(str(value))


def secs(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 3600:
        return f"{v / 3600:.1f} h"
    if v >= 120:
        return f"{v / 60:.1f} min"
    return f"{v:.2f} s" if v < 10 else f"{v:.1f} s"


def nbytes(n: int) -> str:
    if not n:
        return ""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return ""


def clock(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def colors(runs: list[RunReport]) -> dict[str, str]:
    out: dict[str, str] = {}
    for run in runs:
        for p in run.phases:
            out.setdefault(p.phase, PALETTE[len(out) % len(PALETTE)])
    return out


def run_header(run: RunReport) -> RenderableType:
    from rich.text import Text

    t = Text()
    t.append(f"Restart {run.restart_count}" if run.restart_count else "Start", style="bold")
    t.append(f"  allocated {clock(run.allocated)}")
    if run.queue_wait is not None:
        t.append(f"  (submitted {clock(run.submit_time)}, queue wait {secs(run.queue_wait)})")
    t.append("\nStartup ")
    t.append(secs(run.startup), style="bold")
    how = (
        "to the last node's first step"
        if run.startup_end == STARTUP_END
        else (
            f"to the end of {run.startup_end} (no first_step mark: "
            "`bootseer phase end first_step` marks it)"
        )
    )
    t.append(f" ({how})")
    if run.store_egress_bytes or run.peer_bytes:
        t.append("\nStore egress ")
        t.append(nbytes(run.store_egress_bytes) or "0 B", style="bold")
        t.append(f", from peers {nbytes(run.peer_bytes) or '0 B'} (all nodes, all phases)")
    if run.missing_nodes:
        t.append(
            f"\n{run.missing_nodes} of {run.node_count} nodes have no records yet", style="yellow"
        )
    s = run.straggler
    if s is None and len(run.nodes) > 1:
        t.append("\nNo straggler: the nodes were ready within 10% of each other")
    if s is not None:
        t.append("\nStraggler ")
        t.append(s.node, style="bold red")
        t.append(f": ready {secs(s.behind)} after the median node")
        if s.phase:
            t.append(f" ({s.phase} took {secs(s.phase_seconds)}, median {secs(s.phase_median)})")
    return t


def short_bytes(n: int) -> str:
    """``n`` in at most 6 characters (``512K``, ``24.0M``, ``1.2G``); empty for 0."""
    if not n:
        return ""
    for unit in ("B", "K", "M", "G", "T", "P"):
        if n < 1024 or unit == "P":
            return f"{n:.0f}{unit}" if unit == "B" or n >= 100 else f"{n:.1f}{unit}"
        n /= 1024  # type: ignore[assignment]
    return ""


def phase_table(
    run: RunReport, palette: dict[str, str], width: int | None = None
) -> RenderableType:
    """Per phase: time across nodes (min, median, max, slowest node), outcomes, and the
    bytes it moved summed over nodes: in all, from the store and from peers (columns
    shown only where some phase has such bytes). Where ``width`` is too narrow for all
    columns, ``min`` goes first."""
    from rich.console import Console

    table = _phase_table(run, palette, with_min=True, gap=2)
    if width is None:
        return table
    wide = Console(width=10_000)
    for with_min, gap in ((True, 1), (False, 1)):
        if wide.measure(table).maximum <= width:
            break
        table = _phase_table(run, palette, with_min, gap)
    return table


def _phase_table(
    run: RunReport, palette: dict[str, str], with_min: bool, gap: int
) -> RenderableType:
    from rich.table import Table

    table = Table(
        title="Phases across nodes",
        title_justify="left",
        box=None,
        pad_edge=False,
        padding=(0, gap, 0, 0),
    )
    columns = [("phase", "left"), ("nodes", "right")]
    columns += [("min", "right")] if with_min else []
    columns += [("median", "right"), ("max", "right"), ("slowest", "left"), ("outcomes", "left")]
    counts = [
        (name, attr)
        for name, attr in (("bytes", "bytes"), ("store", "store_bytes"), ("peers", "peer_bytes"))
        if any(getattr(p, attr) for p in run.phases)
    ]
    columns += [(name, "right") for name, _ in counts]
    if counts:
        table.title = "Phases across nodes (bytes: summed over nodes)"
    for col, just in columns:
        table.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
    for p in run.phases:
        every = len(p.outcomes) == 1 and sum(p.outcomes.values()) == p.nodes
        outcomes = esc(
            next(iter(p.outcomes))
            if every
            else ", ".join(f"{k} {v}" for k, v in sorted(p.outcomes.items()))
        )
        bad = any(k in ("failed", "timed_out") for k in p.outcomes)
        times = [secs(p.min)] if with_min else []
        table.add_row(
            f"[{palette[p.phase]}]■[/] {esc(p.phase)}",
            str(p.nodes),
            *times,
            secs(p.median),
            secs(p.max),
            esc(p.slowest),
            f"[red]{outcomes}[/]" if bad else outcomes,
            *(short_bytes(getattr(p, attr)) for _, attr in counts),
        )
    return table


def timeline(run: RunReport, palette: dict[str, str], width: int) -> RenderableType:
    """One bar per node from allocation to the end of startup; nested phases (steps
    inside the prolog) are drawn over their parent."""
    from rich.table import Table
    from rich.text import Text

    span = max(run.startup, max((n.done for n in run.nodes), default=0.0), 1e-6)
    width = max(10, width)
    table = Table(
        title=f"Timeline: 0 to {secs(span)} after allocation, one cell = {secs(span / width)}",
        title_justify="left",
        box=None,
        pad_edge=False,
    )
    table.add_column("node")
    table.add_column("", no_wrap=True)
    table.add_column("ready", justify="right")
    straggler = run.straggler.node if run.straggler else None
    for node in run.nodes:
        cells: list[str | None] = [None] * width
        rows = [r for r in node.rows if in_startup(r.phase)]
        for r in sorted(rows, key=lambda r: -r.seconds):
            a = int((r.start - run.allocated) / span * width)
            b = max(a + 1, int((r.end - run.allocated) / span * width + 0.5))
            for i in range(max(0, a), min(width, b)):
                cells[i] = r.phase
        bar = Text()
        for c in cells:
            bar.append("█" if c else "·", style=palette.get(c, "dim") if c else "dim")
        name = Text(node.node, style="bold red" if node.node == straggler else "")
        table.add_row(name, bar, secs(node.ready))
    legend = Text()
    for phase, color in palette.items():
        if in_startup(phase):
            legend.append("■ ", style=color)
            legend.append(f"{phase}  ")
    from rich.console import Group

    return Group(table, legend)


def history_table(report: JobReport) -> RenderableType | None:
    runs = [*report.earlier, *report.runs]
    if len(runs) < 2:
        return None
    from rich.table import Table

    table = Table(
        title="Runs side by side: median (max) across nodes",
        title_justify="left",
        box=None,
        pad_edge=False,
    )
    table.add_column("phase")
    for r in runs:
        mark = "" if r.job_id == report.job_id else " (earlier job)"
        table.add_column(esc(f"{r.label}{mark}"), justify="right")
    seen: dict[str, float] = {}
    for r in runs:
        for p in r.phases:
            seen.setdefault(
                p.phase,
                min(
                    row.start - r.allocated
                    for n in r.nodes
                    for row in n.rows
                    if row.phase == p.phase
                ),
            )
    for name in sorted(seen, key=lambda n: phase_sort_key(n, seen[n])):
        cells = []
        for r in runs:
            stat = r.phase(name)
            cells.append("-" if stat is None else f"{secs(stat.median)} ({secs(stat.max)})")
        table.add_row(esc(name), *cells)
    table.add_row("[bold]startup[/]", *(f"[bold]{secs(r.startup)}[/]" for r in runs))
    table.add_row("queue wait", *(secs(r.queue_wait) for r in runs))
    if any(r.store_egress_bytes or r.peer_bytes for r in runs):
        table.add_row("store egress", *(nbytes(r.store_egress_bytes) or "-" for r in runs))
        table.add_row("from peers", *(nbytes(r.peer_bytes) or "-" for r in runs))
    table.add_row("nodes", *(str(r.node_count) for r in runs))
    return table


def render_job(report: JobReport, console: Console, run_index: int | None = None) -> None:
    from rich.rule import Rule
    from rich.text import Text

    first = report.runs[0]
    gpus = f" x {first.gpus_per_node} GPUs" if first.gpus_per_node else ""
    console.print(
        Rule(
            Text(
                f"Job {report.job_id} {first.job_name!r}  user {first.user}"
                + (f"  account {first.account}" if first.account else "")
                + f"  {first.node_count} nodes{gpus}"
            )
        )
    )
    palette = colors([*report.earlier, *report.runs])
    shown = (
        report.runs
        if run_index is None
        else [r for r in report.runs if r.restart_count == run_index]
    )
    for run in shown:
        console.print(run_header(run))
        console.print(phase_table(run, palette, console.width))
        console.print(timeline(run, palette, console.width - 24))
        console.print()
    history = history_table(report)
    if history is not None:
        console.print(history)


def render_cluster(view: ClusterReport, console: Console) -> None:
    from rich.rule import Rule
    from rich.table import Table

    console.print(Rule(f"Cluster startup {clock(view.since)} to {clock(view.until)}"))
    if not view.runs:
        console.print("No job runs with phase records in this period.")
        return
    share = "-" if view.share is None else f"{view.share * 100:.2f}%"
    summary = Table(box=None, show_header=False, pad_edge=False)
    summary.add_column(style="bold")
    summary.add_column(justify="right")
    for k, v in (
        ("jobs (runs)", f"{view.jobs} ({view.runs})"),
        ("startup, median / p90", f"{secs(view.startup_median)} / {secs(view.startup_p90)}"),
        ("startup, all runs", secs(view.startup_seconds)),
        ("node-seconds starting", f"{view.node_seconds:,.0f}"),
        ("GPU-seconds starting", f"{view.gpu_seconds:,.0f}"),
        ("share of allocated time in startup", f"{share} (over {view.ended_runs} ended runs)"),
    ):
        summary.add_row(k, v)
    console.print(summary)
    sizes = Table(title="Startup by job size", title_justify="left", box=None, pad_edge=False)
    for col in ("size", "runs", "median", "p90", "max"):
        sizes.add_column(col, justify="left" if col == "size" else "right")
    for b in view.buckets:
        sizes.add_row(b.label, str(b.runs), secs(b.median), secs(b.p90), secs(b.max))
    console.print(sizes)
    phases = Table(
        title="Top startup phases by node-seconds", title_justify="left", box=None, pad_edge=False
    )
    for col in ("phase", "node-seconds", "runs", "median per node"):
        phases.add_column(col, justify="left" if col == "phase" else "right")
    for p in view.top_phases:
        phases.add_row(esc(p.phase), f"{p.node_seconds:,.0f}", str(p.runs), secs(p.median))
    console.print(phases)
    console.print(
        f"[dim]{view.rows:,} rows read in {view.read_seconds:.2f} s, "
        f"computed in {view.compute_seconds:.2f} s[/]"
    )
