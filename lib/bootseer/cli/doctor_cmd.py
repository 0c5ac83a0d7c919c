"""``bootseer doctor [NODESET] [--json] [--node NAME]``: check this node's bootseer
install, or each node of NODESET's over ssh."""

from __future__ import annotations

TYPE_CHECKING = False

if TYPE_CHECKING:
    import argparse
    from typing import Any


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

    from bootseer.doctor import Node, render, report, run_checks

    if args.nodeset:
        return run_nodes(args)
    node = Node.here(args.node)
    checks = run_checks(node)
    if args.json:
        print(json.dumps(report(node, checks), indent=2))
    else:
        render(checks)
    return 0 if all(c.ok for c in checks) else 1


def run_nodes(args: argparse.Namespace) -> int:
    import json
    import sys
    from pathlib import Path

    from ClusterShell.NodeSet import NodeSet, NodeSetParseError

    from bootseer.doctor import RSH, ask_nodes, nodes_report, render_nodes
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
        print(json.dumps(nodes_report(answers), indent=2))
    else:
        render_nodes(answers)
    return 0 if all(a.ok for a in answers) else 1
