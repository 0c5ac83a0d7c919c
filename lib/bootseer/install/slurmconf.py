"""The slurm.conf and plugstack.conf lines an install asks the admin to add.

A site's slurm.conf is never rewritten: ``bootseer install`` prints lines that read as
additions to what is there. ``PrologFlags`` keeps the site's flags (``Contain`` stays,
``Alloc`` and ``DeferBatch`` join, ``NoHold`` goes: a job's steps wait for every node's
prolog, :mod:`bootseer.slurm.conf`); ``PrologEpilogTimeout`` is raised only when it
leaves the hooks' deadlines no room, ``BatchStartTimeout`` when srun would give up on a
node whose prolog still runs inside its deadline; a ``Prolog=`` of the site's own is
kept and bootseer's hook joins it in a list.

    >>> conf = {"prologflags": "Contain", "prologepilogtimeout": "300"}
    >>> lines = slurm_conf_lines(Layout(), conf, 90)
    >>> [x for x in lines if x.startswith(("PrologFlags", "BatchStart"))]
    ['PrologFlags=Contain,Alloc,DeferBatch', 'BatchStartTimeout=100']
    >>> [x for x in lines if x.startswith("PrologEpilog")]
    []
"""

from __future__ import annotations

from pathlib import Path

from bootseer.install.layout import Layout, Role
from bootseer.slurm.conf import MESSAGE_TIMEOUT, TIMEOUT_MARGIN, SlurmConfError, launch_wait
from bootseer.stepapi import HOOKS


def slurm_conf_lines(layout: Layout, conf: dict[str, str], deadline: float) -> list[str]:
    """``conf``: the site's slurm.conf settings (:func:`~bootseer.slurm.conf.parse_slurm_conf`),
    maybe empty."""
    lines = []
    for hook in HOOKS:
        ours = str(layout.hook(hook))
        have = [v.strip() for v in conf.get(hook, "").split(",") if v.strip()]
        if ours not in have:
            lines.append(f"{hook.capitalize()}={','.join([*have, ours])}")
    flags = [f.strip() for f in conf.get("prologflags", "").split(",") if f.strip()]
    want = [f for f in flags if f.lower() != "nohold"]  # NoHold: no step waits for prologs
    want += [f for f in ("Alloc", "DeferBatch") if f.lower() not in {x.lower() for x in flags}]
    if want != flags:
        lines.append(f"PrologFlags={','.join(want)}")
    try:  # a step launched while a node's prolog runs waits this long for it
        wait = launch_wait(conf)
        message = launch_wait({**conf, "batchstarttimeout": "0"})
    except SlurmConfError:
        wait, message = 0.0, MESSAGE_TIMEOUT
    if wait < deadline + TIMEOUT_MARGIN:
        lines.append(f"BatchStartTimeout={deadline + 2 * TIMEOUT_MARGIN - message:.0f}")
    need = deadline + 2 * TIMEOUT_MARGIN
    try:
        timeout = float(conf.get("prologepilogtimeout", "0") or 0)
    except ValueError:
        timeout = 0.0
    if not timeout or timeout < deadline + TIMEOUT_MARGIN:
        lines.append(f"PrologEpilogTimeout={need:.0f}")
    return lines


def plugstack_line(layout: Layout, run_dir: Path) -> str:
    """One line for ``plugstack.conf`` (or a file in ``plugstack.conf.d/``)."""
    return f"required {layout.plugin} rundir={run_dir}"


def render(
    layout: Layout,
    conf: dict[str, str],
    deadline: float,
    run_dir: Path,
    source: str,
    hosts: str = "",
    role: Role = "compute",
    packaged: bool = False,
) -> str:
    """The text ``bootseer install`` prints after its summary (80 columns, paths aside).

    ``hosts``: the node set this run prepared (its failed nodes left out). Every step
    names them alone: a plugstack line on a host without the plugin fails every
    ``sbatch`` and ``srun`` there, and slurm.conf's hooks on a node without them fail
    its jobs' prologs (Slurm drains it). ``packaged``: the hosts got the Debian package,
    whose ``postinst`` wrote the plugstack line into Debian's ``plugstack.conf.d/`` (and
    whose ``prerm`` takes it out first)."""
    if not hosts:
        return "No host was prepared: nothing to add anywhere (see the failures above)."
    out = []
    if role == "compute":
        add = slurm_conf_lines(layout, conf, deadline)
        out += [
            "Add to slurm.conf, keeping your other settings, once every compute node has",
            f"bootseer (this run: {hosts}; every slurmd that reads it runs these hooks)",
            f"({source}):",
        ]
        out += [f"    {x}" for x in add] or ["    (nothing: it has them already)"]
    if packaged:
        out.append(
            f"The package wrote the plugstack line on {hosts} (plugstack.conf.d/bootseer.conf,"
        )
        out.append("which Debian's plugstack.conf includes; a plugstack.conf that does not: add")
        out.append(f"    {plugstack_line(layout, run_dir)}")
        out.append("there).")
    else:
        out.append(f"plugstack.conf (or a file in plugstack.conf.d/) on {hosts} alone, which have")
        out.append("the plugin now (a plugstack.conf other hosts share: once they all have it):")
        out.append(f"    {plugstack_line(layout, run_dir)}")
    if role == "compute" and not packaged:
        out.append("Submit and login hosts: bootseer install --role client HOSTS, before the line")
        out.append("reaches them.")
        out.append(
            f"Then restart slurmd (or scontrol reconfigure) and run: bootseer doctor {hosts}"
        )
    else:
        out.append(f"No agent, hooks or slurmd there: sbatch on {hosts} reads the line at once.")
    return "\n".join(out)


def with_node_exporter(text: str, textfile_dir: Path | None) -> str:
    """``text`` (:func:`render`'s) with node_exporter's flag before its last line, where
    the nodes' config has ``[metrics] textfile_dir``."""
    if textfile_dir is None:
        return text
    *head, last = text.split("\n")
    flag = f"    --collector.textfile.directory={textfile_dir}"
    said = "node_exporter on these nodes (docs/admin.md lists the series):"
    return "\n".join([*head, said, flag, last])
