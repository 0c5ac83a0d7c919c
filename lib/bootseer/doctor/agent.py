"""The node agent: it answers, runs this install, sweeps what epilogs left, and writes
its metrics."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import time

from bootseer.doctor.node import Node, needs_config
from bootseer.doctor.result import Check, ok, problem, skip
from bootseer.errors import BootseerError


@needs_config("agent")
def check_agent(node: Node) -> Check:
    """The node agent answers ``ping`` on its socket, which users may reach, and runs
    the install this bootseer is (not the venv of before an upgrade)."""
    name = "agent"
    assert node.cfg is not None
    from bootseer.agentapi.client import AgentClient
    from bootseer.agentapi.jobs import Ping
    from bootseer.nodepaths import NodePaths

    paths = NodePaths(node.cfg)
    sock = paths.agent_socket
    fix = f"systemctl enable --now bootseer-agent; see {paths.agent_log(node.name)}"
    try:
        reply = AgentClient(sock).ask(Ping(), timeout=5)
    except BootseerError as exc:
        return problem(name, str(exc), fix)
    mode = stat.S_IMODE(os.stat(sock).st_mode)
    if mode & 0o006 != 0o006:
        return problem(
            name, f"{sock}: mode {mode:04o}: jobs cannot ask it", "restart bootseer-agent"
        )
    here = os.path.realpath(sys.prefix)
    if reply.prefix and reply.prefix != here:
        # After an upgrade: the agent keeps the venv it started from until it restarts.
        return problem(
            name,
            f"{sock}: the agent runs {reply.prefix}, this bootseer {here}: an older install",
            "bootseer agent --restart (on the node: once no job uses it), or "
            "bootseer install NODESET --restart-agents",
        )
    return ok(name, f"{sock}: node {reply.node}, pid {reply.pid}")


# What the agent logs when it starts its peer service, or does not (p2p/node.py).
P2P_ON, P2P_OFF = "p2p: serving peers", "p2p off: "
LOG_TAIL = 1 << 20  # the end of the agent's log read for the last start's p2p line


@needs_config("p2p")
def check_p2p(node: Node) -> Check:
    """With ``[p2p]`` on, the running agent serves its peers. It decides once, at its
    start: a site key it cannot use then (missing, readable by others) turns p2p off
    until it restarts, even once the key is fixed; its log says so."""
    name = "p2p"
    assert node.cfg is not None
    if not node.cfg.p2p.enabled:
        return skip(name, "[p2p] enabled = false: every node reads the store itself")
    from bootseer.nodepaths import NodePaths

    log = NodePaths(node.cfg).agent_log(node.name)
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - LOG_TAIL))
            tail = f.read().decode(errors="replace")
    except OSError as exc:
        return skip(name, f"{log}: {exc.strerror}: cannot tell whether the agent serves peers")
    said = [x for x in tail.splitlines() if P2P_ON in x or P2P_OFF in x]
    if not said:
        return skip(name, f"{log} says nothing of p2p since its last start")
    last = said[-1]
    if P2P_ON in last:
        return ok(name, f"the agent serves peers on port {node.cfg.p2p.port}")
    why = last.split(P2P_OFF, 1)[1].strip()
    return problem(
        name,
        f"the agent turned p2p off when it started ({why}): every node of a job reads "
        "the store itself",
        "fix the cause (see the site key check), then restart the agent: bootseer agent "
        "--restart (on the node: once no job uses it), or bootseer install NODESET "
        "--restart-agents",
    )


@needs_config("stale jobs")
def check_stale_jobs(node: Node) -> Check:
    """No job's state left on the node (job dir, prepared image, phase spool) of a job
    that Slurm no longer runs here: an epilog killed or never run (agent/sweep.py)."""
    name = "stale jobs"
    assert node.cfg is not None
    from bootseer.agent.sweep import find_stale
    from bootseer.agentapi.client import AgentClient
    from bootseer.agentapi.jobs import Stats
    from bootseer.nodepaths import NodePaths
    from bootseer.slurmjobs import SlurmUnavailable

    paths = NodePaths(node.cfg)
    prepared: list[int] = []
    with contextlib.suppress(BootseerError):  # the agent check says why it does not answer
        prepared = AgentClient(paths.agent_socket).ask(Stats(), timeout=5).jobs
    try:
        found, _, stale = find_stale(node.name, paths.run_dir, node.cfg.phases.squeue, prepared)
    except SlurmUnavailable as exc:
        return skip(name, f"cannot ask Slurm which jobs run on {node.name}: {exc}")
    if not stale:
        return ok(name, f"{len(found.parts)} jobs' state on the node, each a job Slurm runs here")
    jobs = "; ".join(f"{j} ({', '.join(found.parts[j])})" for j in stale[:10])
    more = f" and {len(stale) - 10} more" * (len(stale) > 10)
    interval = node.cfg.hooks.sweep_interval
    when = (
        f"the agent sweeps them within {2 * interval:g}s (hooks.sweep_interval) if it runs"
        if interval > 0
        else "set hooks.sweep_interval (0 turns the agent's sweep off)"
    )
    return problem(
        name,
        f"state of jobs Slurm no longer runs on {node.name} (an epilog killed or never "
        f"run; a job dir holds an agent restart): {jobs}{more}",
        when,
    )


@needs_config("metrics")
def check_metrics(node: Node) -> Check:
    """``[metrics] textfile_dir``: root's, others cannot plant files node_exporter would
    export, and the agent's file there is fresh (written every ``interval``)."""
    name = "metrics"
    assert node.cfg is not None
    d = node.cfg.metrics.textfile_dir
    if d is None:
        return skip(name, "[metrics] textfile_dir unset: no Prometheus textfiles (docs/admin.md)")
    make = f"mkdir -p {d}; chown root {d}; chmod 0755 {d}"
    try:
        st = os.stat(d)
    except OSError as exc:
        return problem(name, f"{d}: {exc.strerror}: the agent and hooks write no metrics", make)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != 0 or mode & 0o022:
        return problem(
            name,
            f"{d}: uid {st.st_uid}, mode {mode:04o}: others may plant series node_exporter exports",
            make,
        )
    from bootseer.agent.metrics import FILE

    agent_file = d / FILE
    try:
        age = time.time() - os.stat(agent_file).st_mtime
    except OSError as exc:
        return problem(
            name,
            f"{agent_file}: {exc.strerror}: the agent has written no metrics",
            "restart bootseer-agent with this config (see the agent check)",
        )
    if age > 3 * node.cfg.metrics.interval + 5:
        return problem(
            name,
            f"{agent_file}: written {age:.0f} s ago, every {node.cfg.metrics.interval:g} s "
            "expected: the agent has stopped writing",
            "restart bootseer-agent; see its log",
        )
    return ok(name, f"{d} (the agent's file {age:.0f} s old)")
