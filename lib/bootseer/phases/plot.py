"""Pictures (``--plot FILE.png|.svg``) with matplotlib, the optional ``plot`` extra.

- one job: a per-node timeline (Gantt bars) of a run, straggler in red;
- the cluster: startup seconds by job size, a box plot per size bucket.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from bootseer.errors import BootseerError
from bootseer.phases.palette import Swatch, phase_palette
from bootseer.phases.startup import in_startup

if TYPE_CHECKING:
    from bootseer.phases.cluster import ClusterReport
    from bootseer.phases.report import RunReport

FORMATS = (".png", ".svg", ".pdf")


def _pyplot(path: Path) -> Any:
    if path.suffix.lower() not in FORMATS:
        raise BootseerError(f"--plot {path}: want a file ending in {', '.join(FORMATS)}")
    try:
        import matplotlib
    except ImportError:
        raise BootseerError("--plot needs matplotlib: pip install 'bootseer[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_timeline(
    runs: list[RunReport], path: Path, palette: dict[str, Swatch] | None = None
) -> None:
    """Per-node timelines of ``runs`` (one panel each, on one time scale), so a faster
    second start shows at a glance; in ``palette``'s colours (the terminal report's)."""
    plt = _pyplot(path)
    phases: list[str] = []
    for run in runs:  # the job's own startup phases, as the terminal timeline draws them
        for n in run.nodes:
            phases += [r.phase for r in n.rows if in_startup(r.phase) and r.phase not in phases]
    # The terminal report's colours (phases/palette.py): the picture and the text agree.
    palette = palette or phase_palette(p.phase for run in runs for p in run.phases)
    color = {p: palette[p].color for p in phases}
    heights = [0.8 + 0.4 * len(run.nodes) for run in runs]
    fig, axes = plt.subplots(
        len(runs),
        1,
        figsize=(10, 1.4 + sum(heights)),
        sharex=True,
        squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )
    for ax, run in zip(axes[:, 0], runs, strict=True):
        _timeline_axes(ax, run, color)
    axes[-1, 0].set_xlabel("seconds after allocation")
    handles = [plt.Rectangle((0, 0), 1, 1, color=color[p]) for p in phases]
    fig.legend(
        handles,
        phases,
        loc="lower center",
        ncol=min(6, len(phases)),
        fontsize="small",
        frameon=False,
    )
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path)
    plt.close(fig)


def _timeline_axes(ax: Any, run: RunReport, color: dict[str, str]) -> None:
    nodes = run.nodes
    for y, n in enumerate(nodes):
        rows = [r for r in n.rows if in_startup(r.phase)]
        for r in sorted(rows, key=lambda r: -r.seconds):  # nested steps drawn over the prolog
            ax.barh(
                y,
                max(r.seconds, 0.02),
                left=r.start - run.allocated,
                height=0.8 if r.phase == "prolog" else 0.6,
                color=color[r.phase],
                edgecolor="black" if r.outcome in ("failed", "timed_out") else "none",
            )
    ax.set_yticks(range(len(nodes)), [n.node for n in nodes])
    if run.straggler:
        for label in ax.get_yticklabels():
            if label.get_text() == run.straggler.node:
                label.set_color("red")
    ax.invert_yaxis()
    ax.axvline(run.startup, color="black", linestyle="--", linewidth=1)
    title = f"job {run.job_id}" + (f" run {run.restart_count}" if run.restart_count else "")
    title += f": startup {run.startup:.1f} s"
    if run.straggler:
        title += f", straggler {run.straggler.node} (+{run.straggler.behind:.1f} s)"
    ax.set_title(title, fontsize="medium")


def plot_cluster(view: ClusterReport, path: Path) -> None:
    plt = _pyplot(path)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    buckets = [b for b in view.buckets if b.startups]
    if buckets:
        ax.boxplot([b.startups for b in buckets], showfliers=False)
        ax.set_xticks(
            range(1, len(buckets) + 1),
            [f"{b.label}\n({b.runs} run{'s' if b.runs != 1 else ''})" for b in buckets],
        )
    ax.set_ylabel("startup seconds (allocation to first step)")
    ax.set_xlabel("job size")
    share = "" if view.share is None else f", {view.share * 100:.2f}% of allocated time"
    ax.set_title(f"Startup by job size: {view.runs} runs{share}")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
