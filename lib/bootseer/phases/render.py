"""Terminal rendering of reports with rich: tables, and a per-node timeline (Gantt bars).

Job names, users, accounts, phase names, outcomes and node names come from the job or
from rows in the store, so every one of them is escaped (``esc``) or put in a ``Text``
before rich sees it: a job named ``[/]`` must neither restyle the report nor crash it.
Neither escapes a terminal's own controls (rich passes ESC through as it is), so what a
user wrote (a mark's detail, the script's path, a name) also goes through ``visible``: a
detail holding ``ESC ] 52`` must not write the clipboard of whoever reads the report.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from bootseer.phases.palette import Swatch, phase_palette
from bootseer.phases.report import JobReport, RunReport, phase_sort_key
from bootseer.phases.schema import STARTUP_END
from bootseer.phases.startup import in_startup

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.text import Text

    from bootseer.phases.cluster import ClusterReport
    from bootseer.phases.seal import Tally
    from bootseer.phases.slurmcheck import SlurmCheck


# C0 and C1 controls and DEL (ESC starts a terminal's control sequences; a newline
# would start a line of the report's own), and the bidirectional overrides and isolates
# that make a terminal show text in another order than it is ("Trojan Source").
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def visible(value: object) -> str:
    r"""``value`` with every control character written out as Python writes it in a
    string (``\x1b``), so a terminal shows it instead of obeying it.

    >>> visible("job\x1b]0;pwned\x07 ok")
    'job\\x1b]0;pwned\\x07 ok'
    """
    return _CONTROLS.sub(lambda m: repr(m.group())[1:-1], str(value))


def esc(value: object) -> str:
    """``value`` as text that rich shows as it is (no markup, no terminal controls)."""
    from rich.markup import escape

    return escape(visible(value))


def secs(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 3600:
        return f"{v / 3600:.1f} h"
    if v >= 120:
        return f"{v / 60:.1f} min"
    return f"{v:.2f} s" if v < 10 else f"{v:.1f} s"


def nbytes(n: int) -> str:
    """IEC, as everywhere (``units.iec``); empty for 0."""
    from bootseer.units import iec

    return iec(n) if n else ""


def clock(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def colors(runs: list[RunReport]) -> dict[str, Swatch]:
    return phase_palette(p.phase for run in runs for p in run.phases)


def plain(console: Console) -> bool:
    """True where colours cannot tell phases apart: none (``NO_COLOR``, a file, a dumb
    terminal) or only 16 (two phases would get the same one). Phases are then drawn
    with their glyphs, still in colour where there is some."""
    return console.no_color or console.color_system not in ("256", "truecolor")


def swatch_mark(sw: Swatch | None, glyphs: bool, solid: str = "■") -> tuple[str, str]:
    """(character, style) that marks a phase; rich drops the style where there is no
    colour."""
    if sw is None:
        return "·", "dim"
    return (sw.glyph if glyphs else solid), sw.color


def run_header(run: RunReport) -> RenderableType:
    from rich.text import Text

    t = Text()
    t.append(f"Restart {run.restart_count}" if run.restart_count else "Start", style="bold")
    t.append(f"  allocated {clock(run.allocated)}")
    if run.queue_wait is not None:
        t.append(f"  queue wait {secs(run.queue_wait)}")
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
        t.append(visible(s.node), style="bold red")
        t.append(f": ready {secs(s.behind)} after the median node")
        if s.phase:
            t.append(f"\n  its {s.phase} took {secs(s.phase_seconds)}, ")
            t.append(f"the median node's {secs(s.phase_median)}")
    return t


def failures(run: RunReport) -> RenderableType | None:
    """Why phases failed or ran out of time, in the words the step recorded (the same
    ``detail`` as ``--json``), nodes folded as a node set (``n[1-3]``)."""
    from ClusterShell.NodeSet import NodeSet
    from rich.text import Text

    found = run.failures()
    if not found:
        return None
    t = Text("Why phases failed", style="bold")
    for phase, outcome, detail, nodes in found:
        where = visible(NodeSet.fromlist(nodes))
        t.append(f"\n{visible(phase)} {outcome.replace('_', ' ')} on {where}: ", style="red")
        t.append(visible(detail) if detail else "(no reason recorded)")
    return t


BYTE_COLUMNS = (("bytes", "bytes"), ("store", "store_bytes"), ("peers", "peer_bytes"))


def phase_table(
    run: RunReport, palette: dict[str, Swatch], width: int | None = None, no_color: bool = False
) -> list[RenderableType]:
    """Per phase: time across nodes (min, median, max, slowest node), outcomes, and the
    bytes it moved summed over nodes: in all, from the store and from peers (columns
    shown only where some phase has such bytes). Where ``width`` is too narrow for one
    table, the columns get closer, ``min`` goes, then the bytes get a table of their
    own: a row is never cut or split."""
    from rich.console import Console

    counts = [(n, a) for n, a in BYTE_COLUMNS if any(getattr(p, a) for p in run.phases)]
    # (with min, gap, with nodes): the nodes column goes only where every phase ran on
    # every node (the title then says how many).
    everywhere = all(p.nodes == len(run.nodes) for p in run.phases)
    variants = [(True, 2, True), (True, 1, True), (False, 1, True)]
    variants += [(False, 1, False)] if everywhere else []
    layouts: list[list[RenderableType]] = [
        [_phase_table(run, palette, no_color, counts, *v)] for v in variants
    ]
    if counts:
        layouts += [
            [
                _phase_table(run, palette, no_color, [], *v),
                _bytes_table(run, palette, no_color, counts, v[1]),
            ]
            for v in variants
        ]
    if width is None:
        return layouts[0]
    wide = Console(width=10_000)
    for tables in layouts:
        if all(wide.measure(t).maximum <= width for t in tables):
            return tables
    return layouts[-1]


def _phase_cell(p: str, palette: dict[str, Swatch], no_color: bool) -> RenderableType:
    from rich.text import Text

    char, style = swatch_mark(palette.get(p), no_color)
    return Text.assemble((char, style), " ", p)


def _phase_table(
    run: RunReport,
    palette: dict[str, Swatch],
    no_color: bool,
    counts: list[tuple[str, str]],
    with_min: bool,
    gap: int,
    with_nodes: bool,
) -> RenderableType:
    from rich.table import Table

    table = Table(
        title="Phases across nodes"
        + ("" if with_nodes else f" (each on all {len(run.nodes)})")
        + (" (bytes: summed over the nodes)" if counts else ""),
        title_justify="left",
        box=None,
        pad_edge=False,
        padding=(0, gap, 0, 0),
    )
    columns = [("phase", "left")] + ([("nodes", "right")] if with_nodes else [])
    columns += [("min", "right")] if with_min else []
    columns += [("median", "right"), ("max", "right"), ("slowest", "left"), ("outcomes", "left")]
    columns += [(name, "right") for name, _ in counts]
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
            _phase_cell(p.phase, palette, no_color),
            *([str(p.nodes)] if with_nodes else []),
            *times,
            secs(p.median),
            secs(p.max),
            esc(p.slowest),
            f"[red]{outcomes}[/]" if bad else outcomes,
            *(nbytes(getattr(p, attr)) for _, attr in counts),
        )
    return table


def _bytes_table(
    run: RunReport,
    palette: dict[str, Swatch],
    no_color: bool,
    counts: list[tuple[str, str]],
    gap: int,
) -> RenderableType:
    from rich.table import Table

    table = Table(
        title="Bytes per phase, summed over the nodes",
        title_justify="left",
        box=None,
        pad_edge=False,
        padding=(0, gap, 0, 0),
    )
    table.add_column("phase", no_wrap=True)
    names = {"bytes": "moved", "store": "from the store", "peers": "from peers"}
    for name, _ in counts:
        table.add_column(names[name], justify="right", no_wrap=True)
    for p in run.phases:
        if any(getattr(p, attr) for _, attr in counts):
            table.add_row(
                _phase_cell(p.phase, palette, no_color),
                *(nbytes(getattr(p, attr)) for _, attr in counts),
            )
    return table


def timeline(
    run: RunReport,
    palette: dict[str, Swatch],
    width: int,
    no_color: bool = False,
    legend_width: int = 80,
) -> list[RenderableType]:
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
            bar.append(*swatch_mark(palette.get(c) if c else None, no_color, "█"))
        name = Text(visible(node.node), style="bold red" if node.node == straggler else "")
        table.add_row(name, bar, secs(node.ready))
    shown = {r.phase for n in run.nodes for r in n.rows if in_startup(r.phase)}
    legend = Text()
    used = 0
    for phase, sw in palette.items():
        if phase not in shown:  # this run's startup phases, as drawn
            continue
        entry = 2 + len(phase)
        if used and used + 2 + entry > legend_width:  # an entry never splits
            legend.append("\n")
            used = 0
        elif used:
            legend.append("  ")
            used += 2
        legend.append(*swatch_mark(sw, no_color))
        legend.append(f" {phase}")
        used += entry
    return [table, legend]


def history_table(report: JobReport, width: int | None = None) -> RenderableType | None:
    """Runs side by side (earlier jobs of the same script, then this job's runs), as
    many of the latest as fit in ``width``; a note says how many were left out."""
    runs = [*report.earlier, *report.runs]
    if len(runs) < 2:
        return None
    from rich.console import Console, Group
    from rich.text import Text

    wide = Console(width=10_000)
    for keep in range(len(runs), 1, -1):
        table = _history_table(report, runs[-keep:])
        if width is None or wide.measure(table).maximum <= width:
            break
    left = len(runs) - keep
    if not left:
        return table
    note = Text(
        f"{left} earlier run{'s' if left > 1 else ''} left out to fit {width} columns "
        "(--json has all)",
        style="dim",
    )
    return Group(table, note)


def _history_table(report: JobReport, runs: list[RunReport]) -> RenderableType:
    from rich.table import Table

    table = Table(
        title="Runs side by side: median (max) across nodes",
        title_justify="left",
        box=None,
        pad_edge=False,
    )
    table.add_column("phase", no_wrap=True)
    for r in runs:
        mark = "this job" if r.job_id == report.job_id else "earlier"
        table.add_column(f"{esc(r.label)}\n{mark}", justify="right", no_wrap=True)
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


def job_parts(
    report: JobReport, width: int, no_color: bool, run_index: int | None = None
) -> list[RenderableType]:
    """What ``bootseer report JOBID`` prints, in order, for a terminal ``width`` wide."""
    from rich.rule import Rule
    from rich.text import Text

    first = report.runs[0]
    gpus = f" x {first.gpus_per_node} GPUs" if first.gpus_per_node else ""
    task = f" (array task {first.array_task})" if first.array_task else ""
    parts: list[RenderableType] = [
        Rule(Text(f"Job {report.job_id}{task}")),
        Text(
            f"{visible(repr(first.job_name))}  user {visible(first.user)}"
            + (f"  account {visible(first.account)}" if first.account else "")
            + f"  {first.node_count} nodes{gpus}"
        ),
    ]
    if first.script.startswith("sha256:"):
        parts.append(Text(f"Script from standard input, {visible(first.script)}"))
    elif first.script:
        parts.append(Text(f"Script {visible(first.script)}"))
    palette = colors(report.runs)  # the job's own phases, as --plot colours them
    shown = (
        report.runs
        if run_index is None
        else [r for r in report.runs if r.restart_count == run_index]
    )
    for run in shown:
        parts.append(run_header(run))
        parts += phase_table(run, palette, width, no_color)
        why = failures(run)
        if why is not None:
            parts.append(why)
        parts += timeline(run, palette, width - 24, no_color, width)
        parts.append(Text(""))
    history = history_table(report, width)
    if history is not None:
        parts.append(history)
    note = out_of_window(report.marks_dropped, report.marks_clipped)
    if note is not None:
        parts.append(note)
    parts += seal_notes(report.seals)
    if report.slurm is not None:
        others = any(r.restart_count != report.slurm.run for r in report.runs)
        parts.append(slurm_note(report.slurm, others))
    return parts


def seal_notes(seals: Tally | None) -> list[Text]:
    """What the files' seals said (:mod:`bootseer.phases.seal`): files not counted, and
    whether the seals could be checked at all."""
    from rich.text import Text

    from bootseer.phases.seal import MAX_FILE_BYTES

    if seals is None:
        return []
    out = []
    if seals.refused:
        kinds = list(seals.refused.values())
        unsealed, altered, oversize = (kinds.count(k) for k in ("unsealed", "altered", "oversize"))
        why = ", ".join(
            w
            for w in (
                f"{unsealed:,} without a seal" if unsealed else "",
                f"{altered:,} whose seal does not verify (altered, moved or forged)"
                if altered
                else "",
                f"{oversize:,} too large to check (over {MAX_FILE_BYTES >> 30} GiB)"
                if oversize
                else "",
            )
            if w
        )
        first = visible(min(seals.refused))
        out.append(
            Text(
                f"{len(seals.refused):,} phase file(s) ({seals.rows_refused:,} rows) not counted, "
                f"not as bootseer's root-run parts wrote them: {why}; e.g. {first}",
                style="yellow",
            )
        )
    if seals.unsealed:
        out.append(
            Text(
                f"{len(seals.unsealed):,} phase file(s) ({seals.rows_unsealed:,} rows) carry no "
                "seal: not written by bootseer's root-run parts (or written before seals); "
                f"counted here, not by root's report; e.g. {visible(min(seals.unsealed))}",
                style="yellow",
            )
        )
    if not seals.checked:
        out.append(Text(f"Seals not checked: {visible(seals.unchecked_why)}.", style="dim"))
    return out


def slurm_note(check: SlurmCheck, others: bool) -> Text:
    """What checking the job's rows against Slurm found (a report without the key)."""
    from rich.text import Text

    if check.run is None:
        return Text(f"Not checked against Slurm: {visible(check.unchecked)}.", style="dim")
    run = f"run {check.run}" if check.run else "the run"
    earlier = " (not the earlier runs: Slurm lists the latest allocation only)" if others else ""
    if not check.dropped:
        return Text(
            f"Checked against Slurm: {run}'s rows are of the job's nodes and user{earlier}.",
            style="dim",
        )
    nodes = ", ".join(visible(n) for n in sorted(check.dropped))
    return Text(
        f"{sum(check.dropped.values()):,} row(s) of {run} not counted: node(s) {nodes} are "
        f"not the job's, or not its user's, as Slurm lists it{earlier}.",
        style="yellow",
    )


def out_of_window(dropped: int, clipped: int) -> Text | None:
    """The line that says how many marks lay outside their job's window, or None."""
    from rich.text import Text

    if not dropped and not clipped:
        return None
    return Text(
        f"{dropped:,} mark(s) outside their job's window dropped, {clipped:,} clipped to it "
        "(a job's marks count from its prolog to its epilog)",
        style="yellow",
    )


def render_job(report: JobReport, console: Console, run_index: int | None = None) -> None:
    for part in job_parts(report, console.width, plain(console), run_index):
        console.print(part)


def cluster_parts(view: ClusterReport) -> list[RenderableType]:
    """What ``bootseer report --since`` prints, in order."""
    from rich.rule import Rule
    from rich.table import Table
    from rich.text import Text

    parts: list[RenderableType] = [
        Rule(f"Cluster startup {clock(view.since)} to {clock(view.until)}")
    ]
    if not view.runs:
        parts.append(Text("No job runs with phase records in this period."))
        return parts + seal_notes(view.seals)
    share = "-" if view.share is None else f"{view.share * 100:.2f}%"
    summary = Table(box=None, show_header=False, pad_edge=False)
    summary.add_column(style="bold", no_wrap=True)
    summary.add_column(justify="right", no_wrap=True)
    for k, v in (
        ("jobs (runs)", f"{view.jobs} ({view.runs})"),
        ("startup, median / p90", f"{secs(view.startup_median)} / {secs(view.startup_p90)}"),
        ("startup, all runs", secs(view.startup_seconds)),
        ("node-seconds starting", f"{view.node_seconds:,.0f}"),
        ("GPU-seconds starting", f"{view.gpu_seconds:,.0f}"),
        ("share of allocated time in startup", f"{share} (over {view.ended_runs} ended runs)"),
    ):
        summary.add_row(k, v)
    parts.append(summary)
    sizes = Table(title="Startup by job size", title_justify="left", box=None, pad_edge=False)
    for col in ("size", "runs", "median", "p90", "max"):
        sizes.add_column(col, justify="left" if col == "size" else "right", no_wrap=True)
    for b in view.buckets:
        sizes.add_row(b.label, str(b.runs), secs(b.median), secs(b.p90), secs(b.max))
    parts.append(sizes)
    phases = Table(
        title="Top startup phases by node-seconds", title_justify="left", box=None, pad_edge=False
    )
    for col in ("phase", "node-seconds", "runs", "median per node"):
        phases.add_column(col, justify="left" if col == "phase" else "right", no_wrap=True)
    for p in view.top_phases:
        phases.add_row(esc(p.phase), f"{p.node_seconds:,.0f}", str(p.runs), secs(p.median))
    parts.append(phases)
    note = out_of_window(view.marks_dropped, view.marks_clipped)
    if note is not None:
        parts.append(note)
    parts += seal_notes(view.seals)
    parts.append(
        Text(
            f"{view.rows:,} rows read in {view.read_seconds:.2f} s, "
            f"computed in {view.compute_seconds:.2f} s",
            style="dim",
        )
    )
    return parts


def render_cluster(view: ClusterReport, console: Console) -> None:
    for part in cluster_parts(view):
        console.print(part)
