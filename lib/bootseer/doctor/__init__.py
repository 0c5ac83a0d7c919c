"""``bootseer doctor``: what is wrong with this node, and what to change.

A pre-flight in the spirit of ``enroot-check``: each check is a small function taking a
:class:`Node` (the site config, slurm.conf and the node's name) and returning one
:class:`Check`, ``ok``, ``problem`` (with what to change) or ``skip`` (it cannot tell).
The checks live by what they look at (``files``, ``slurmd``, ``agent``, ``store``,
``host``), in the order printed in ``checks``; ``fanout`` asks many nodes over ssh and
``report`` prints the answers. Slurm's files are read by :mod:`bootseer.slurm`.

Nothing here runs at import beyond the standard library; the store check imports pyarrow.
"""

from __future__ import annotations

from bootseer.doctor.checks import CHECKS, run_checks, store_check
from bootseer.doctor.fanout import RSH, NodeAnswer, ask_node, ask_nodes
from bootseer.doctor.node import CheckFn, Node
from bootseer.doctor.report import nodes_report, render, render_nodes, report
from bootseer.doctor.result import OK, PROBLEM, SKIP, Check

__all__ = [
    "CHECKS",
    "OK",
    "PROBLEM",
    "RSH",
    "SKIP",
    "Check",
    "CheckFn",
    "Node",
    "NodeAnswer",
    "ask_node",
    "ask_nodes",
    "nodes_report",
    "render",
    "render_nodes",
    "report",
    "run_checks",
    "store_check",
]
