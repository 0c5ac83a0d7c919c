"""Many nodes at once: one SSH session per node in a thread pool, then one summary.

The summary folds nodes with the same outcome into one node set, as ClusterShell's
``clubak`` does, so a hundred nodes that installed alike take one line:

    >>> fold([NodeReport("n1", "unchanged"), NodeReport("n2", "unchanged")])
    ['n[1-2]: unchanged']
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from ClusterShell.NodeSet import NodeSet

from bootseer.errors import BootseerError, describe
from bootseer.install import releases
from bootseer.install.agents import restart_agent
from bootseer.install.layout import Layout
from bootseer.install.node import NodeReport, Target, install_node
from bootseer.install.remote import Node


def install_all(
    nodes: Iterable[str],
    target_for: Callable[[str], Target],
    connect: Callable[[str], Node],
    *,
    dry_run: bool = False,
    fanout: int = 16,
    log: Callable[[str], None] = lambda _: None,
    restart_agents: bool = False,
) -> list[NodeReport]:
    """``restart_agents``: then ask each node's agent to restart in place (install.agents)."""

    def one(name: str) -> NodeReport:
        with connect(name) as node:
            target = target_for(name)
            report = install_node(node, target, dry_run=dry_run, log=log)
            if dry_run or not target.agent:
                return report
            if not restart_agents:
                if report.agent_stale:
                    # A running agent keeps the venv it started from (kept for it);
                    # restarting it under jobs would take their images away.
                    report.notes.append("a running agent keeps the old until --restart-agents")
                return report
            outcome = restart_agent(node, target.layout, force=report.agent_stale)
            if outcome.state == "failed":
                report.status = "failed"
                report.error = f"installed, but {outcome.line()}"
            elif outcome.state != "current" or report.status != "unchanged":
                report.notes.append(outcome.line())
            return report

    return each(nodes, fanout, one)


def rollback_all(
    nodes: Iterable[str],
    layout_for: Callable[[str], Layout],
    connect: Callable[[str], Node],
    python: str,
    *,
    dry_run: bool = False,
    fanout: int = 16,
    restart_agents: bool = False,
) -> list[NodeReport]:
    """Each node back to the version before (install.releases); the one it ran becomes
    the previous. ``restart_agents``: then the agents restart in place onto it."""

    def one(name: str) -> NodeReport:
        with connect(name) as node:
            lay = layout_for(name)
            done = releases.rollback(node, python, lay, dry_run)
            venv = done.venv.rsplit("/", 1)[-1]
            files = f" ({len(done.files)} files)" if done.files else ""
            report = NodeReport(name, "rolled back", [f"venv {venv}{files}"])
            if dry_run:
                report.status = "would change"
                return report
            if not done.swap:
                report.notes.append("what ran was not whole: no version to go forward to")
            if lay.unit is not None and str(lay.unit) in done.files:
                node.check(["sh", "-c", "[ ! -d /run/systemd/system ] || systemctl daemon-reload"])
            if restart_agents:
                outcome = restart_agent(node, lay, force=True)
                if outcome.state == "failed":
                    report.status = "failed"
                    report.error = f"rolled back, but {outcome.line()}"
                elif outcome.state != "not_running":
                    report.notes.append(outcome.line())
            return report

    return each(nodes, fanout, one)


def each(nodes: Iterable[str], fanout: int, one: Callable[[str], NodeReport]) -> list[NodeReport]:
    """``one(node)`` on every node, ``fanout`` at a time, in the nodes' order; a node whose
    ``one`` raised is reported failed with the cause's message, the others go on."""

    def guarded(name: str) -> NodeReport:
        try:
            return one(name)
        except BootseerError as exc:
            return NodeReport(name, "failed", error=str(exc))
        except Exception as exc:  # one node's surprise must not hide the others' results
            return NodeReport(name, "failed", error=describe(exc, named=True))

    names = list(nodes)
    with ThreadPoolExecutor(max_workers=max(1, min(fanout, len(names)))) as pool:
        return list(pool.map(guarded, names))


def fold(reports: Iterable[NodeReport]) -> list[str]:
    by_line: dict[str, NodeSet] = {}
    for r in reports:
        by_line.setdefault(r.line(), NodeSet()).add(r.node)
    # In the order of each outcome's first node (the reports follow the node set's order).
    return [f"{nodes}: {line}" for line, nodes in by_line.items()]
