"""``bootseer doctor [--json] [--node NAME]``: check this node's bootseer install."""

from __future__ import annotations

TYPE_CHECKING = False

if TYPE_CHECKING:
    import argparse
    from typing import Any

WIDTH = 80
NAME_WIDTH = 9
MARK = {"ok": ("ok", "green"), "problem": ("FAIL", "bold red"), "skip": ("skip", "yellow")}


def register(sub: Any) -> None:
    p = sub.add_parser(
        "doctor",
        help="check this node: plugin, hooks, agent, FUSE, store, files, Python",
        description="Check this node's bootseer install; each problem says what to change. "
        "Exit 0 when every check passes, 1 otherwise.",
    )
    p.add_argument("--json", action="store_true", help="one JSON document")
    p.add_argument("--node", metavar="NAME", help="the node name %%n stands for (default: host)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import json

    from bootseer.doctor import Node, report, run_checks

    node = Node.here(args.node)
    checks = run_checks(node)
    if args.json:
        print(json.dumps(report(node, checks), indent=2))
    else:
        render(checks)
    return 0 if all(c.ok for c in checks) else 1


def render(checks: Any) -> None:
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
