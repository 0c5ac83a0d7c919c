"""``bootseer doctor [NODESET] [--json] [--node NAME]``: check this node's bootseer
install, or each node of NODESET's over ssh."""

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
        help="check this node (or NODESET over ssh): what is wrong, what to change",
        description="Check this node's bootseer install, or each node of NODESET's over ssh; each "
        "problem says what to change. "
        "Exit 0 when every check passes, 1 otherwise.",
    )
    p.add_argument(
        "nodeset", nargs="?", metavar="NODESET", help="check these nodes over ssh (n[1-64])"
    )
    p.add_argument("--json", action="store_true", help="one JSON document")
    p.add_argument("--node", metavar="NAME", help="the node name %%n stands for (default: host)")
    p.add_argument(
        "--rsh",
        metavar="CMD",
        help="how to reach a node: CMD NODE COMMAND-LINE (default: ssh in batch mode)",
    )
    p.add_argument(
        "--remote-bootseer",
        metavar="PATH",
        help="bootseer on the nodes (default: this one's path)",
    )
    p.add_argument(
        "--fanout", type=int, default=32, metavar="N", help="nodes at once (default: 32)"
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import json

    from bootseer.doctor import Node, report, run_checks

    if args.nodeset:
        return run_nodes(args)
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


def run_nodes(args: argparse.Namespace) -> int:
    import json
    import sys
    from pathlib import Path

    from ClusterShell.NodeSet import NodeSet, NodeSetParseError

    from bootseer.doctor import RSH, ask_nodes
    from bootseer.errors import BootseerError

    if args.node:
        raise BootseerError("--node is for one node; a NODESET names its nodes")
    try:
        nodes = list(NodeSet(args.nodeset))
    except NodeSetParseError as exc:
        raise BootseerError(f"bad node set {args.nodeset!r}: {exc}") from None
    bootseer = args.remote_bootseer or str(Path(sys.executable).parent / "bootseer")
    answers = ask_nodes(nodes, args.rsh or RSH, bootseer, args.fanout)
    if args.json:
        doc = {
            "ok": all(a.ok for a in answers),
            "nodes": {a.node: a.to_json() for a in answers},
        }
        print(json.dumps(doc, indent=2))
    else:
        render_nodes(answers)
    return 0 if all(a.ok for a in answers) else 1


def render_nodes(answers: Any) -> None:
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
