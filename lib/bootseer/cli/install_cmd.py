"""``bootseer install NODESET``: build once here, install on every node over SSH, print
the slurm.conf and plugstack lines to add (bootseer.install)."""

from __future__ import annotations

TYPE_CHECKING = False

if TYPE_CHECKING:
    import argparse
    from typing import Any


_UNSET: Any = object()  # --metrics-dir not given


def _path_or_none(value: str) -> Any:
    from pathlib import Path

    return None if value in ("", "none") else Path(value)


def where_installed(p: Any) -> None:
    """The options that say where an install's files go on a node (install, uninstall)."""
    from pathlib import Path

    p.add_argument("--prefix", type=Path, default=Path("/opt/bootseer"), metavar="DIR")
    p.add_argument("--etc", type=Path, default=Path("/etc/bootseer"), metavar="DIR")
    p.add_argument(
        "--unit-dir",
        type=_path_or_none,
        default=Path("/etc/systemd/system"),
        metavar="DIR",
        help="where the agent's unit goes ('none': no unit)",
    )
    p.add_argument(
        "--bin-dir",
        type=_path_or_none,
        default=Path("/usr/local/bin"),
        metavar="DIR",
        help="a bootseer link for jobs' PATH ('none': no link)",
    )


def register(sub: Any) -> None:
    from pathlib import Path

    p = sub.add_parser(
        "install",
        help="install bootseer on NODESET over ssh (built once here), print the slurm.conf lines",
        description="Build bootseer once on this machine (wheels, SPANK plugin) and install it on "
        "each node of NODESET over ssh: a venv on the node's own Python, the hooks, the plugin, "
        "the agent's systemd unit, the site config, the store secrets and the site key. Nodes "
        "that already have it are left unchanged. slurm.conf is not touched: the lines to add "
        "are printed. Exit 0 when every node is installed, 1 otherwise.",
    )
    p.add_argument("nodeset", metavar="NODESET", help="the nodes (ClusterShell syntax: n[1-64])")
    p.add_argument(
        "--role",
        choices=("compute", "client"),
        default="compute",
        help="compute (default): nodes that run jobs get everything (hooks, agent, plugin, "
        "CLI, config, site key, secrets); client: submit and login hosts get the plugin, the "
        "CLI and the config alone (no agent, no hooks, no root-only files)",
    )
    p.add_argument(
        "--client",
        metavar="NODESET",
        default="",
        help="submit and login hosts, installed in the same run as --role client installs them",
    )
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="the site config to install (default: $BOOTSEER_CONFIG or /etc/bootseer/config.toml)",
    )
    where_installed(p)
    p.add_argument(
        "--python",
        default="/usr/bin/python3",
        metavar="PATH",
        help="the nodes' Python the venv is built on (default /usr/bin/python3)",
    )
    p.add_argument(
        "--metrics-dir",
        type=_path_or_none,
        default=_UNSET,
        metavar="DIR",
        help="node_exporter's textfile collector directory, for [metrics] textfile_dir where "
        "the config leaves it unset (default /var/lib/prometheus/node-exporter, Debian's; "
        "'none': no metrics); made on the nodes if missing",
    )
    p.add_argument("--ssh-config", type=Path, metavar="FILE", help="default ~/.ssh/config")
    p.add_argument(
        "--slurm-conf",
        type=Path,
        metavar="FILE",
        help="the site's slurm.conf, for lines that add to it (default: $SLURM_CONF)",
    )
    p.add_argument(
        "--build-dir", type=Path, default=Path("/var/tmp/bootseer-install"), metavar="DIR"
    )
    p.add_argument("--dry-run", action="store_true", help="say what would change; change nothing")
    p.add_argument(
        "--restart-agents",
        action="store_true",
        help="then restart each node's agent in place where it runs an older install or "
        "config, once no job uses it (the summary says which jobs a node waits for)",
    )
    p.add_argument(
        "--rollback",
        action="store_true",
        help="return each node to the version installed before this one (kept there; no "
        "build, the config stays); the one it ran becomes the previous, so a second "
        "--rollback goes forward again",
    )
    p.add_argument(
        "--deb",
        type=Path,
        metavar="FILE",
        help="push this Debian package (scripts/build-deb) instead of building here: "
        "installed with apt-get on each node, in its own layout (/opt/bootseer, "
        "/etc/bootseer), with the site config and the root-only files",
    )
    p.add_argument("--fanout", type=int, default=16, metavar="N", help="nodes at once (default 16)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import sys

    from ClusterShell.NodeSet import NodeSet, NodeSetParseError

    from bootseer.config import config_path
    from bootseer.errors import BootseerError
    from bootseer.install import bundle, fanout
    from bootseer.install.files import (
        DEFAULT_TEXTFILE_DIR,
        SiteFiles,
        node_files,
        parse,
        with_textfile_dir,
    )
    from bootseer.install.layout import Layout
    from bootseer.install.node import Target
    from bootseer.install.remote import Node

    def say(msg: str) -> None:
        print(f"bootseer install: {msg}", file=sys.stderr, flush=True)

    try:
        nodes = NodeSet(args.nodeset)
        clients = NodeSet(args.client)
    except NodeSetParseError as exc:
        raise BootseerError(f"bad NODESET {args.nodeset!r} or {args.client!r}: {exc}") from None
    if clients and (args.role == "client" or nodes & clients):
        raise BootseerError("--client names the submit and login hosts of a compute install")

    def role_of(node: str) -> str:
        return "client" if node in clients or args.role == "client" else "compute"

    nodes = nodes | clients
    layout = Layout(args.prefix, args.etc, args.unit_dir, args.bin_dir)
    if args.rollback:
        reports = fanout.rollback_all(
            nodes,
            layout.for_node,
            lambda name: Node(name, args.ssh_config),
            args.python,
            dry_run=args.dry_run,
            fanout=args.fanout,
            restart_agents=args.restart_agents and args.role == "compute" and not clients,
        )
        for line in fanout.fold(reports):
            print(line)
        return 0 if all(r.status != "failed" for r in reports) else 1
    config = args.config or config_path()
    site = SiteFiles.read(config)
    own = parse(site.config, config).metrics.textfile_dir
    given = args.metrics_dir is not _UNSET
    if given and args.metrics_dir is not None and own is not None and own != args.metrics_dir:
        raise BootseerError(
            f"{config} sets [metrics] textfile_dir = {own}, --metrics-dir says "
            f"{args.metrics_dir}: change one"
        )
    metrics_dir = args.metrics_dir if given else DEFAULT_TEXTFILE_DIR
    site = dataclasses.replace(site, config=with_textfile_dir(site.config, config, metrics_dir))
    cfg = parse(site.config, config)
    if args.deb is not None:
        reports = _push_deb(args, nodes, site, say, role_of)
        return _finish(args, reports, layout, cfg, role_of)
    built = bundle.build(args.build_dir, say)
    say(
        f"{len(built.wheels)} wheels (Python {built.python[0]}.{built.python[1]}), "
        f"venv {built.wheels_digest}; {'checking' if args.dry_run else 'installing on'} {nodes}"
    )

    def target_for(node: str) -> Target:
        lay = layout.for_node(node)
        if role_of(node) == "client":  # no agent, so no unit and no metrics of its own
            return Target(
                dataclasses.replace(lay, unit_dir=None),
                node_files(lay, built, site, "client"),
                built,
                args.python,
                agent=False,
            )
        textfile_dir = cfg.for_node(node).metrics.textfile_dir
        dirs = (textfile_dir,) if textfile_dir is not None else ()
        return Target(lay, node_files(lay, built, site), built, args.python, dirs)

    reports = fanout.install_all(
        nodes,
        target_for,
        lambda name: Node(name, args.ssh_config),
        dry_run=args.dry_run,
        fanout=args.fanout,
        log=say,
        restart_agents=args.restart_agents and args.role == "compute",
    )
    return _finish(args, reports, layout, cfg, role_of)


def _finish(args: argparse.Namespace, reports: Any, layout: Any, cfg: Any, role_of: Any) -> int:
    """The folded summary, then the lines to add for the hosts this run prepared, for
    each role it prepared."""
    from ClusterShell.NodeSet import NodeSet

    from bootseer.install import fanout, slurmconf
    from bootseer.slurm.conf import parse_slurm_conf, slurm_conf_path

    for line in fanout.fold(reports):
        print(line)
    slurm_conf = args.slurm_conf or slurm_conf_path()
    try:
        conf = parse_slurm_conf(slurm_conf.read_text(), slurm_conf.parent)
        source = f"compared with {slurm_conf}"
    except OSError:
        conf, source = {}, f"{slurm_conf} not found here: the lines a slurm.conf needs"
    deadline = max(cfg.hooks.prolog_deadline, cfg.hooks.epilog_deadline)
    print()
    # The steps name the hosts this run prepared alone (never a host without the plugin).
    roles = {role_of(r.node) for r in reports} or {args.role}
    texts = []
    for role in sorted(roles, key=lambda r: r != "compute"):
        prepared = NodeSet.fromlist(
            [r.node for r in reports if r.status != "failed" and role_of(r.node) == role]
        )
        text = slurmconf.render(
            layout,
            conf,
            deadline,
            cfg.paths.run_dir,
            source,
            str(prepared),
            role,
            packaged=args.deb is not None,
        )
        if role == "compute" and prepared:
            text = slurmconf.with_node_exporter(text, cfg.metrics.textfile_dir)
        texts.append(text)
    print("\n".join(texts))
    return 0 if all(r.status != "failed" for r in reports) else 1


def _push_deb(args: argparse.Namespace, nodes: Any, site: Any, say: Any, role_of: Any) -> Any:
    from bootseer.errors import BootseerError
    from bootseer.install.debpkg import LAYOUT
    from bootseer.install.debpush import deb_version, push_deb
    from bootseer.install.fanout import each
    from bootseer.install.files import site_files
    from bootseer.install.node import NodeReport
    from bootseer.install.remote import Node

    if (args.prefix, args.etc) != (LAYOUT.prefix, LAYOUT.etc):
        raise BootseerError(f"--deb installs in the package's {LAYOUT.prefix} and {LAYOUT.etc}")
    version = deb_version(args.deb)
    say(f"pushing {args.deb.name} (version {version}) to {nodes}")

    def one(name: str) -> NodeReport:
        with Node(name, args.ssh_config) as node:
            role = role_of(name)
            files = site_files(LAYOUT.for_node(name), site, role)
            return push_deb(node, args.deb, version, files, role, args.dry_run)

    return each(nodes, args.fanout, one)
