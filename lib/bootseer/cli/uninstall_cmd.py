"""``bootseer uninstall NODESET``: take an install back off each node over SSH, once
Slurm no longer names its plugin and hooks there (bootseer.install.uninstall)."""

from __future__ import annotations

TYPE_CHECKING = False

if TYPE_CHECKING:
    import argparse
    from typing import Any


def register(sub: Any) -> None:
    from pathlib import Path

    from bootseer.cli.install_cmd import where_installed

    p = sub.add_parser(
        "uninstall",
        help="remove bootseer from NODESET over ssh, once Slurm no longer names it there",
        description="Remove what bootseer install put on each node of NODESET: the agent "
        "(stopped and disabled), its unit, the hooks, the plugin, the venvs, the docs, the "
        "config, the site key and store secrets it names, the bootseer link. A node whose "
        "Slurm configuration (--slurm-etc) still names the plugin or the hooks is refused: "
        "take the plugstack line out first, then slurm.conf's Prolog/Epilog, restart slurmd. "
        "Exit 0 when every node is done, 1 otherwise.",
    )
    p.add_argument("nodeset", metavar="NODESET", help="the nodes (ClusterShell syntax: n[1-64])")
    p.add_argument("--config", type=Path, metavar="FILE", help="the site config installed")
    where_installed(p)
    p.add_argument(
        "--slurm-etc",
        type=Path,
        default=Path("/etc/slurm"),
        metavar="DIR",
        help="the nodes' Slurm configuration directory, searched for lines naming bootseer",
    )
    p.add_argument("--ssh-config", type=Path, metavar="FILE", help="default ~/.ssh/config")
    p.add_argument("--dry-run", action="store_true", help="say what would go; change nothing")
    p.add_argument("--fanout", type=int, default=16, metavar="N", help="nodes at once (default 16)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ClusterShell.NodeSet import NodeSet, NodeSetParseError

    from bootseer.config import config_path
    from bootseer.errors import BootseerError
    from bootseer.install.fanout import each, fold
    from bootseer.install.files import SiteFiles, parse
    from bootseer.install.layout import Layout
    from bootseer.install.node import NodeReport
    from bootseer.install.remote import Node
    from bootseer.install.uninstall import uninstall_node

    try:
        nodes = NodeSet(args.nodeset)
    except NodeSetParseError as exc:
        raise BootseerError(f"bad NODESET {args.nodeset!r}: {exc}") from None
    config = args.config or config_path()
    cfg = parse(SiteFiles.read(config).config, config)
    layout = Layout(args.prefix, args.etc, args.unit_dir, args.bin_dir)

    def one(name: str) -> NodeReport:
        with Node(name, args.ssh_config) as node:
            site = cfg.for_node(name)
            return uninstall_node(
                node,
                layout.for_node(name),
                site.site.key_file,
                site.store.secrets_file,
                args.slurm_etc,
                args.dry_run,
            )

    reports = each(nodes, args.fanout, one)
    for line in fold(reports):
        print(line)
    return 0 if all(r.status != "failed" for r in reports) else 1
