"""Every report and listing at 80 columns without colour (``NO_COLOR``, output to a
file): no table row is split over two lines, no line is longer than 80, and phases are
told apart without colour. Issue 13, item 5."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

from bootseer.cli import build_parser
from bootseer.cli.listing import format_table
from bootseer.phases.cluster import cluster_report
from bootseer.phases.palette import phase_palette
from bootseer.phases.reader import PhaseDataset
from bootseer.phases.render import cluster_parts, job_parts
from bootseer.phases.report import job_report
from bootseer.phases.schema import JobMeta, PhaseRow
from bootseer.phases.writer import write_rows
from bootseer.store import Store
from bootseer.units import iec

from .conftest import T0

WIDTH = 80
NODES = [f"gpu-node-{i:04d}" for i in range(1, 17)]
SCRIPT = "/home/ada/projects/llama/launch/train-llama-25b-with-a-long-name.sh"
REASON = (
    "deps: restore of snapshot 4f3a9c0e1b2d4c5a8e7f6a5b4c3d2e1f failed: "
    "TarFile.extract() got an unexpected keyword argument 'filter' (Python 3.11.2)"
)


def rows(job_id: int, node: str, restart: int = 0, t0: float = T0, k: int = 0) -> list[PhaseRow]:
    """A heavy startup: every standard phase, a phase of the job's own, bytes from the
    store and from peers, a failed restore on three nodes, an overrun on one."""
    m = JobMeta(
        job_id,
        restart,
        "train-llama-25b",
        "ada",
        "ml-research",
        node,
        len(NODES),
        8,
        t0 - 45,
        array_job_id=4200,
        array_task_id=17,
        script=SCRIPT,
    )
    slow = 9.0 if node == "gpu-node-0011" else 0.0
    bad = node in NODES[3:6]
    return [
        m.row("prolog", t0, t0 + 31),
        m.row(
            "image_prefetch",
            t0 + 0.1,
            t0 + 20 + k,
            "timed_out" if node == NODES[0] else "ok",
            6 << 30,
            "hot set: 3100 of 4000 blocks at the step deadline" if node == NODES[0] else "",
            store_bytes=400 << 20,
            peer_bytes=5 << 30,
        ),
        m.row(
            "deps_restore",
            t0 + 0.1,
            t0 + 30,
            "failed" if bad else "ok",
            3 << 30,
            REASON if bad else "",
            store_bytes=3 << 30,
        ),
        m.row("ckpt_mount", t0 + 0.1, t0 + 1),
        m.row("container_start", t0 + 31, t0 + 40),
        m.row("tokenizer_warmup_cache", t0 + 40, t0 + 44),
        m.row(
            "ckpt_load",
            t0 + 44,
            t0 + 160 + slow,
            bytes=400 << 30,
            store_bytes=25 << 30,
            peer_bytes=375 << 30,
        ),
        m.row("framework_init", t0 + 160 + slow, t0 + 170 + slow),
        m.row("first_step", t0 + 170 + slow, t0 + 190 + slow),
        m.row(
            "image_background_fill",
            t0 + 190,
            t0 + 900,
            bytes=30 << 30,
            store_bytes=1 << 30,
            peer_bytes=29 << 30,
        ),
        m.row("epilog", t0 + 3600, t0 + 3620),
        m.row("image_trace", t0 + 3600, t0 + 3601),
        m.row("deps_capture", t0 + 3601, t0 + 3619, "skipped"),
        m.row("ckpt_unmount", t0 + 3601, t0 + 3602),
    ]


@pytest.fixture
def heavy(store: Store) -> PhaseDataset:
    for i, job in enumerate((4180, 4185, 4190, 4195)):  # earlier jobs of the same script
        for node in NODES:
            write_rows(store, rows(job, node, t0=T0 - 86400 * (4 - i), k=i), "epilog")
    for restart in (0, 1):
        for node in NODES:
            write_rows(store, rows(4217, node, restart, T0 + 7200 * restart), "epilog")
    return PhaseDataset(store)


def lines(part: Any, width: int) -> list[str]:
    console = Console(
        file=io.StringIO(), width=width, no_color=True, color_system=None, legacy_windows=False
    )
    console.print(part)
    out: str = console.file.getvalue()  # type: ignore[attr-defined]
    return out.splitlines()


def assert_no_row_split(parts: list[Any]) -> str:
    """Each part fits 80 columns, and each table (anything but prose) has as many lines
    at 80 columns as where nothing can wrap."""
    text = []
    for part in parts:
        narrow = lines(part, WIDTH)
        assert all(cell_len(line) <= WIDTH for line in narrow), "\n".join(narrow)
        assert "…" not in "".join(narrow), "\n".join(narrow)  # no cell cut short either
        if not isinstance(part, Text):
            assert len(narrow) == len(lines(part, 10_000)), "\n".join(narrow)
        text += narrow
    return "\n".join(text)


def test_job_report_at_80_columns_without_colour(heavy: PhaseDataset) -> None:
    report = job_report(heavy, 4217)
    assert [r.job_id for r in report.earlier] == [4180, 4185, 4190, 4195]
    out = assert_no_row_split(job_parts(report, WIDTH, no_color=True))
    # Without colour, phases are told apart by their glyphs, in the bars and the legend.
    palette = phase_palette(p.phase for p in report.runs[0].phases)
    legend = {palette[p].glyph for p in ("prolog", "image_prefetch", "ckpt_load", "first_step")}
    assert len(legend) == 4
    bar = next(line for line in out.splitlines() if line.startswith("gpu-node-0011 "))
    assert {palette["ckpt_load"].glyph, palette["first_step"].glyph} <= set(bar)
    assert f"{palette['tokenizer_warmup_cache'].glyph} tokenizer_warmup_cache" in out
    # The reasons, in the text report (not only in --json).
    assert "deps_restore failed on gpu-node-[0004-0006]:" in out
    assert "image_prefetch timed out on gpu-node-0001:" in out
    assert "TarFile.extract() got an unexpected keyword argument 'filter'" in " ".join(out.split())
    assert "array task 4200_17" in out and "earlier runs left out to fit 80 columns" in out
    assert "\x1b" not in out


def test_cluster_view_at_80_columns(heavy: PhaseDataset) -> None:
    view = cluster_report(heavy, since=T0 - 10 * 86400, until=T0 + 86400)
    out = assert_no_row_split(cluster_parts(view))
    assert all(f"\n{p.phase} " in out for p in view.top_phases) and view.top_phases


def test_report_command_into_a_file_with_no_color(
    heavy: PhaseDataset, store: Store, tmp_path: Path
) -> None:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": str(WIDTH)}
    for args in (["4217"], ["4200_17"], ["--since", "3650d"]):
        with open(tmp_path / "out.txt", "w") as f:
            r = subprocess.run(
                [sys.executable, "-m", "bootseer.cli", "report", *args, "--store", store.uri],
                stdout=f,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                timeout=120,
            )
        assert r.returncode == 0, r.stderr
        out = (tmp_path / "out.txt").read_text()
        assert "\x1b" not in out and all(cell_len(line) <= WIDTH for line in out.splitlines())
        if args[0] == "4200_17":  # the array task is job 4217, not job 420017
            assert out.startswith("─") and "Job 4217 (array task 4200_17)" in out


def test_listings_keep_one_row_per_line() -> None:
    """deps ls (one table per scope, so its 32-character keys stay whole), image ls and
    ckpt ls, with long names: one line per row, within 80 columns; a long last value is
    shortened from the left on a terminal, never into a file."""
    key = "4f3a9c0e1b2d4c5a8e7f6a5b4c3d2e1f"
    deps = [[iec(3 << 30), "3d ago", "12h ago", key], [iec(512), "2w ago", "-", "0" * 32]]
    image = "/shared/images/team-llama/experiments/2026-11/pytorch-24.05-custom-build.sqsh"
    images = [
        [iec(38 << 30), "1a2b3c4d5e6f", "name", "pytorch-24.05-cuda12.4-everything:2026-11-01"],
        [iec(25 << 30), "6f5e4d3c2b1a", "path", image],
    ]
    ckpt = [[iec(400 << 30), "12h ago", "17", "6400", "step-120000/model-00001-of-00004.pt"]]
    for headers, table in (
        (["SIZE", "CAPTURED", "USED", "KEY"], deps),
        (["SIZE", "IMAGE", "KIND", "NAME OR PATH"], images),
        (["SIZE", "MODIFIED", "VERSION", "UNITS", "NAME"], ckpt),
    ):
        out = format_table(headers, table, right={0}, width=WIDTH).splitlines()
        assert len(out) == len(table) + 1 and all(len(line) <= WIDTH for line in out), out
        for row, line in zip(table, out[1:], strict=True):
            assert line.split()[:2] == row[0].split()
            assert line.endswith(row[-1][-20:])  # a long last value keeps its end
    assert key in format_table(["SIZE", "CAPTURED", "USED", "KEY"], deps, width=WIDTH)
    assert image in format_table(["SIZE", "IMAGE", "KIND", "NAME OR PATH"], images, width=None)


def all_parsers() -> list[tuple[str, Any]]:
    import argparse

    out = []
    todo = [("bootseer", build_parser())]
    while todo:
        name, p = todo.pop()
        out.append((name, p))
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += [(f"{name} {n}", sp) for n, sp in action.choices.items()]
    return out


def test_help_reads_at_80_columns_without_rest_markup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    for name, parser in all_parsers():
        text = parser.format_help()
        assert "``" not in text and ":meth:" not in text and "::\n" not in text, name
        long = [line for line in text.splitlines() if len(line) > WIDTH]
        assert not long, (name, long)


def test_version() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "bootseer.cli", "--version"], capture_output=True, text=True
    )
    assert r.returncode == 0 and r.stdout.startswith("bootseer ")


def test_the_picture_uses_the_reports_colours_and_only_startup_phases(
    heavy: PhaseDataset, store: Store, tmp_path: Path
) -> None:
    report = job_report(heavy, 4217)
    svg = tmp_path / "t.svg"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "bootseer.cli",
            "report",
            "4217",
            "--store",
            store.uri,
            "--plot",
            str(svg),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    drawn = svg.read_text().lower()
    palette = phase_palette(p.phase for run in report.runs for p in run.phases)
    for phase in ("prolog", "image_prefetch", "ckpt_load", "tokenizer_warmup_cache"):
        assert palette[phase].color in drawn, phase
    for phase in ("epilog", "deps_capture"):  # the job's end is not its startup
        assert palette[phase].color not in drawn, phase


def test_glyphs_wherever_colours_cannot_tell_phases_apart() -> None:
    """No colour, or 16 colours (prolog and epilog would both be cyan): glyphs; 256
    colours and more: solid bars in the palette's colours."""
    from bootseer.phases.render import plain

    def console(**kw: Any) -> Console:
        return Console(file=io.StringIO(), force_terminal=True, **kw)

    assert plain(console(no_color=True)) and plain(console(color_system="standard"))
    assert plain(Console(file=io.StringIO()))  # a file
    assert not plain(console(color_system="256")) and not plain(console(color_system="truecolor"))
