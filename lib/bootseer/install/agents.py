"""``bootseer install --restart-agents``: each node's agent runs the new install, as soon
as no job uses it.

After its install, each node is asked (over the same SSH session) to run
``bootseer agent --restart`` with the node's new bootseer: the agent restarts in place
if it runs another venv than the installed one, or the config, secrets or site key it
read changed (``--force``), and only once no job uses it (it answers which jobs it waits
for; :mod:`bootseer.agent.handover`). The node's summary line says what became of it:

    >>> Outcome("pending", (12, 13)).line()
    'agent restarts once jobs 12, 13 end'
"""

from __future__ import annotations

import json

from bootseer.agent.handover import HANDOVER_STATES, Outcome
from bootseer.choices import one_of
from bootseer.install.layout import Layout
from bootseer.install.remote import Node

TIMEOUT = 300.0  # the node's wait for the new agent (120 s) and the drain, with room


def restart_agent(node: Node, layout: Layout, force: bool) -> Outcome:
    """Ask ``node``'s agent to restart in place (``layout`` resolved for the node)."""
    argv = ["env", f"BOOTSEER_CONFIG={layout.config}", str(layout.bootseer), "agent"]
    argv += ["--restart", "--json", "--node", node.name, *(["--force"] if force else [])]
    r = node.run(argv, timeout=TIMEOUT)
    try:
        doc = json.loads(r.out)
        state = one_of(doc["state"], HANDOVER_STATES)
        if state is None:
            return Outcome("failed", detail=f"unknown state {str(doc['state'])[:100]!r}")
        return Outcome(
            state,
            tuple(int(j) for j in doc.get("jobs", ())),
            int(doc.get("connections", 0)),
            str(doc.get("prefix", "")),
            str(doc.get("detail", "")),
        )
    except (ValueError, KeyError, TypeError):
        said = (r.err.strip().splitlines() or [f"exit status {r.status}"])[-1]
        return Outcome("failed", detail=said[-300:])
