"""``bootseer agent``: the node agent (systemd runs this), and its restart in place.

bootseer agent --node n1             # serve: lazy images over FUSE, the socket, peers
bootseer agent --restart             # an upgrade: the running agent restarts once idle
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from bootseer.errors import BootseerError, describe


def register(sub: Any) -> None:
    ag = sub.add_parser("agent", help="run the node agent (lazy images over FUSE)")
    ag.add_argument(
        "--node",
        default=None,
        help="node name for %%n in paths (default $SLURMD_NODENAME or host name)",
    )
    ag.add_argument(
        "--restart",
        action="store_true",
        help="ask the running agent to restart in place (an upgrade): if it runs another "
        "install than this bootseer (or with --force), once no job uses it",
    )
    ag.add_argument("--force", action="store_true", help="with --restart: even if current")
    ag.add_argument(
        "--now", action="store_true", help="with --restart: now or not at all (no waiting)"
    )
    ag.add_argument("--json", action="store_true", help="with --restart: the outcome as JSON")
    ag.set_defaults(handler=_agent)


def _node(arg: str | None) -> str:
    from bootseer.nodepaths import node_name

    return arg or node_name()


def _agent(args: argparse.Namespace) -> int:
    from bootseer.nonumpy import without_numpy

    without_numpy()  # before pyarrow: the agent never uses NumPy (bootseer.nonumpy)
    from bootseer.agent.daemon import serve
    from bootseer.config import load_config

    node = _node(args.node)
    cfg = load_config().for_node(node)
    if args.restart:
        return _restart_agent(args, cfg)
    if os.geteuid() != 0:
        raise BootseerError("the agent runs as root (it mounts FUSE for all users)")

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    from bootseer.nodepaths import NodePaths
    from bootseer.sdnotify import notify

    socket = NodePaths(cfg).agent_socket

    def ready() -> None:
        say(f"bootseer agent ready on {socket}")
        try:
            notify("READY=1")  # Type=notify in the unit bootseer install writes
        except OSError as exc:  # whoever listened is gone (after a restart in place)
            say(f"bootseer agent: READY=1 not sent: {describe(exc)}")

    listen = serve(cfg, node, ready=ready)
    if listen is not None:  # restarting in place: the same pid, the install's venv now
        from bootseer.agent.handover import exec_again

        exec_again(listen)
    # Stopped: unmounted, socket closed, "agent stopped" logged. Exit now, not when the
    # interpreter has joined every pool thread: one held by a store or peer read that
    # never returns would keep the process (and systemd's stop) waiting without end.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _restart_agent(args: argparse.Namespace, cfg: Any) -> int:
    from bootseer.cli.caller import require_root

    require_root("agent --restart", "the agent restarts for root only")
    from dataclasses import asdict

    from bootseer.agent.handover import ask_restart
    from bootseer.agentapi.client import AgentClient
    from bootseer.nodepaths import NodePaths

    client = AgentClient(NodePaths(cfg).agent_socket)
    outcome = ask_restart(client, args.force, when_idle=not args.now)
    if args.json:
        print(json.dumps(asdict(outcome)))
    else:
        print(outcome.line())
    return 1 if outcome.state in ("failed", "unsupported") else 0
