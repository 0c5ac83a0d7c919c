"""Whether a job's steps wait for every node's prolog, or lose the tasks of a slow one.

Slurm 22.05 holds a step's task launch on a node until the job's prolog there has ended,
and srun waits for that ``MessageTimeout + BatchStartTimeout`` seconds, then runs the
step without the node's tasks (:mod:`bootseer.slurm.conf` says where in Slurm's source).
A prolog within its deadline (``[hooks] prolog_deadline``) but past that bound lost its
node's tasks: 3 of 4 ran. ``PrologFlags=DeferBatch`` starts a batch script only once
every node's prolog is done; a ``BatchStartTimeout`` past the prolog's deadline covers a
step launched while a prolog still runs (srun making its own allocation)."""

from __future__ import annotations

from bootseer.doctor.node import Node, needs_config
from bootseer.doctor.result import Check, ok, problem, skip
from bootseer.slurm.conf import (
    TIMEOUT_MARGIN,
    SlurmConfError,
    has_alloc,
    launch_wait,
    prolog_flags,
)


@needs_config("launch")
def check_step_launch(node: Node) -> Check:
    """``PrologFlags`` has ``DeferBatch`` (not ``NoHold``), and srun's wait for a node
    whose prolog still runs (``MessageTimeout + BatchStartTimeout``) outlasts the
    prolog's deadline."""
    name = "launch"
    assert node.cfg is not None
    try:
        conf = node.slurm
        wait = launch_wait(conf)
    except SlurmConfError as exc:
        return problem(name, str(exc), "set $SLURM_CONF to the node's slurm.conf, or fix it")
    raw = conf.get("prologflags", "")
    if not has_alloc(raw):
        return skip(name, "the Prolog does not run at allocation (see prolog)")
    deadline = node.cfg.hooks.prolog_deadline
    flags = [f.strip() for f in raw.split(",") if f.strip()]
    have = prolog_flags(raw)
    lost = "its tasks there are lost (srun: 'Task launch ... failed on node ...: Socket timed out')"
    if "nohold" in have:
        keep = [f for f in flags if f.lower() != "nohold"]
        keep += [] if "deferbatch" in have else ["DeferBatch"]
        return problem(
            name,
            f"{node.slurm_conf}: PrologFlags={raw} has NoHold: slurmctld waits for no "
            "node's prolog, a batch script starts at once and its srun meets a node "
            f"whose prolog still runs: after {wait:g}s (MessageTimeout+BatchStartTimeout) "
            f"{lost}",
            f"PrologFlags={','.join(keep)}",
        )
    if "deferbatch" not in have:
        return problem(
            name,
            f"{node.slurm_conf}: PrologFlags={raw} lacks DeferBatch: a batch script starts "
            "once its own node's prolog is done, and its srun waits for a slower node's "
            f"only {wait:g}s (MessageTimeout+BatchStartTimeout), less than the prolog's "
            f"{deadline:g}s deadline: {lost}"
            if wait <= deadline
            else f"{node.slurm_conf}: PrologFlags={raw} lacks DeferBatch: a batch script "
            "starts once its own node's prolog is done, before the others'",
            f"PrologFlags={','.join([*flags, 'DeferBatch'])} (keep the flags already there)",
        )
    if wait < deadline + TIMEOUT_MARGIN:
        batch = conf.get("batchstarttimeout", "") or "10 (default)"
        message = launch_wait({**conf, "batchstarttimeout": "0"})  # MessageTimeout alone
        need = deadline + 2 * TIMEOUT_MARGIN - message
        return problem(
            name,
            f"{node.slurm_conf}: MessageTimeout+BatchStartTimeout={wait:g}s "
            f"(BatchStartTimeout={batch}) is within the prolog's {deadline:g}s deadline: "
            "a step launched while a node's prolog still runs (srun making its own "
            f"allocation) gives up on that node first and {lost}",
            f"BatchStartTimeout={need:.0f} or lower hooks.prolog_deadline",
        )
    return ok(
        name,
        f"PrologFlags={raw}: batch scripts start once every node's prolog is done; "
        f"other steps wait {wait:g}s for a node's prolog (MessageTimeout+BatchStartTimeout) "
        f"> its {deadline:g}s deadline",
    )
