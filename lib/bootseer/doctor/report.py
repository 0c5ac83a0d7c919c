"""What ``bootseer doctor`` prints: one line per check at 80 columns, the answers of many
nodes folded by node set, or one JSON document."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from bootseer.doctor.result import Check

if TYPE_CHECKING:
    from bootseer.doctor.fanout import NodeAnswer
    from bootseer.doctor.node import Node

WIDTH = 80
NAME_WIDTH = 9
MARK = {"ok": ("ok", "green"), "problem": ("FAIL", "bold red"), "skip": ("skip", "yellow")}


def report(node: Node, checks: list[Check]) -> dict[str, object]:
    """``--json``'s document."""
    return {
        "node": node.name,
        "ok": all(c.ok for c in checks),
        "checks": [c.to_json() for c in checks],
    }


def nodes_report(answers: list[NodeAnswer]) -> dict[str, object]:
    """``NODESET --json``'s document."""
    return {
        "ok": all(a.ok for a in answers),
        "nodes": {a.node: a.to_json() for a in answers},
    }


def render(checks: Iterable[Check]) -> None:
    """One line per check at 80 columns (a passing one cut to fit; a problem's finding
    whole, wrapped, then what to change). Text is printed as given (rich's ``Text``: no
    markup in a path is interpreted)."""
    import shutil

    from rich.console import Console
    from rich.text import Text

    width = min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns)
    console = Console(highlight=False, width=width)
    pad = " " * (5 + NAME_WIDTH + 1)
    for c in checks:
        mark, style = MARK[c.status]
        head = Text(f"{mark:<4} ", style=style)
        if not c.fix:  # a passing check: one line, cut to fit
            line = head + Text(f"{c.name:<{NAME_WIDTH}} {c.detail}")
            line.truncate(width, overflow="ellipsis")
            console.print(line, no_wrap=True, overflow="ellipsis")
            continue
        # A problem: all of what was found, then what to change, wrapped under it.
        first, *rest = wrap(f"{c.name:<{NAME_WIDTH}} {c.detail}", width, " " * 5, pad)
        console.print(head + Text(first[5:]), no_wrap=True, overflow="ellipsis")
        for part in rest + wrap(f"fix: {c.fix}", width, pad, pad + "     "):
            console.print(Text(part), no_wrap=True, overflow="ellipsis")


def wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    """``text`` in lines of ``width`` (a word longer than a line is cut)."""
    import textwrap

    return textwrap.wrap(
        text,
        width,
        initial_indent=first,
        subsequent_indent=rest,
        break_on_hyphens=False,
    )


def render_nodes(answers: Iterable[NodeAnswer]) -> None:
    """Folded as clubak folds output: the nodes where every check passed in one node
    set; then each problem once, with the nodes that have it word for word, what was
    found and what to change; then the nodes that did not answer, by what was said."""
    import shutil

    from ClusterShell.NodeSet import NodeSet
    from rich.console import Console
    from rich.text import Text

    width = min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns)
    console = Console(highlight=False, width=width)
    pad = " " * 7

    def say(mark: str, style: str, text: str, more: list[str]) -> None:
        first, *rest = wrap(text, width, " " * 5, pad)
        console.print(Text(f"{mark:<4} ", style=style) + Text(first[5:]), no_wrap=True)
        for part in rest + more:
            console.print(Text(part), no_wrap=True, overflow="ellipsis")

    fine = [a.node for a in answers if a.ok]
    problems: dict[tuple[str, str, str], list[str]] = {}
    down: dict[str, list[str]] = {}
    for a in answers:
        if a.error:
            down.setdefault(a.error, []).append(a.node)
        for c in a.checks:
            if not c.ok:
                problems.setdefault((c.name, c.detail, c.fix), []).append(a.node)
    if fine:
        say("ok", "green", f"{NodeSet.fromlist(fine)}: every check passed", [])
    for (name, detail, fix), nodes in problems.items():
        lines = wrap(detail, width, pad, pad)
        lines += wrap(f"fix: {fix}", width, pad, pad + "     ")
        say("FAIL", "bold red", f"{name} on {NodeSet.fromlist(nodes)}", lines)
    for error, nodes in down.items():
        say("DOWN", "bold red", f"{NodeSet.fromlist(nodes)}: {error}", [])
