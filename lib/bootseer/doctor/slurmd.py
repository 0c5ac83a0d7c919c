"""What slurmd runs of bootseer: the SPANK plugin (plugstack.conf's line, the plugin's
env file contract), the Prolog and Epilog, and the time it gives them."""

from __future__ import annotations

import glob
import os
import re
import sys
from pathlib import Path

from bootseer.doctor.node import Node, needs_config
from bootseer.doctor.result import Check, ok, problem, skip
from bootseer.slurm.conf import TIMEOUT_MARGIN, SlurmConfError, has_alloc
from bootseer.slurm.plugstack import PLUGIN, parse_plugstack, plugstack_path
from bootseer.stepapi import HOOKS


@needs_config("plugstack")
def check_plugstack(node: Node) -> Check:
    """The SPANK plugin is in plugstack.conf and its ``rundir=`` is the config's run_dir."""
    name = "plugstack"
    assert node.cfg is not None
    try:
        path = plugstack_path(node.slurm, node.slurm_conf)
        entries = [e for e in parse_plugstack(path) if Path(e.plugin).name == PLUGIN]
    except SlurmConfError as exc:
        return problem(name, str(exc), f"add PlugStackConfig to {node.slurm_conf}")
    template = node.cfg.template.paths.run_dir if node.cfg.template else node.cfg.paths.run_dir
    installed = installed_plugin()
    line = f"required {installed or DEFAULT_PLUGIN} rundir={template}"
    # Without an install here, the plugin comes first: a line naming a missing plugin
    # fails every job's step (and every sbatch on a submit host).
    first = "" if installed else f"{install_fix(node)}, then "
    if not entries:
        return problem(name, f"{path}: no {PLUGIN} line", f"{first}add to {path}: {line}")
    e = entries[-1]
    where = f"{e.source}:{e.lineno}"
    if e.plugin.startswith("/") and not os.path.isfile(e.plugin):
        fix = f"{first}set {where} to: {line}; restart slurmd"
        return problem(name, f"{where}: {e.plugin} does not exist", fix)
    from bootseer.nodename import expand

    rundir = os.path.normpath(expand(e.rundir, node.name))
    run_dir = os.path.normpath(node.cfg.paths.run_dir)
    if rundir != run_dir:
        return problem(
            name,
            f"{where}: rundir={e.rundir} is not paths.run_dir {template}: "
            "jobs get no BOOTSEER_* variables",
            f"set rundir={template} in {where}, or paths.run_dir in {node.config_path}",
        )
    return ok(name, f"{where}: {e.kind} {Path(e.plugin).name} rundir={e.rundir}")


# Where ``bootseer install`` puts the plugin under its prefix (install.layout.Layout.plugin;
# doctor and install stay independent of each other).
PLUGIN_UNDER_PREFIX = Path("lib") / "slurm" / PLUGIN
DEFAULT_PLUGIN = Path("/opt/bootseer") / PLUGIN_UNDER_PREFIX


def installed_plugin(venv: Path | None = None) -> Path | None:
    """The plugin the install this bootseer runs from put on the node (``<prefix>/venv``,
    a link to ``<prefix>/venvs/<digest>``: ``<prefix>/lib/slurm/bootseer.so``), or None
    (a checkout's venv, or an install without its plugin)."""
    venv = Path(sys.prefix) if venv is None else venv
    prefix = venv.parent.parent if venv.parent.name == "venvs" else venv.parent
    found = prefix / PLUGIN_UNDER_PREFIX
    return found if found.is_file() else None


def install_fix(node: Node) -> str:
    """The command that puts bootseer (and its plugin) on this node, as installed."""
    return f"on the admin machine: bootseer install {node.name or 'NODESET'}"


CONTRACT_MARK = re.compile(rb"bootseer-spank-contract=(\d+);")  # spank/bootseer.c


def plugin_contract(path: Path) -> int | None:
    """The env file contract the plugin file at ``path`` was built for (its
    ``plugin_contract`` string), or None for a plugin built before there was one."""
    with open(path, "rb") as f:
        found = CONTRACT_MARK.search(f.read(64 << 20))
    return int(found[1]) if found else None


def _plugin_file(node: Node) -> tuple[str, Path | None]:
    """Where plugstack.conf's last ``bootseer.so`` line is, and the file it loads (a
    relative name is looked for in slurm.conf's ``PluginDir``); None when not found."""
    entries = parse_plugstack(plugstack_path(node.slurm, node.slurm_conf))
    entries = [e for e in entries if Path(e.plugin).name == PLUGIN]
    if not entries:
        return "", None
    e = entries[-1]
    where = f"{e.source}:{e.lineno}"
    if e.plugin.startswith("/"):
        return where, Path(e.plugin) if os.path.isfile(e.plugin) else None
    for d in node.slurm.get("plugindir", "").split(":"):
        if d and os.path.isfile(os.path.join(d, e.plugin)):
            return where, Path(d, e.plugin)
    return where, None


def check_plugin(node: Node) -> Check:
    """The installed SPANK plugin speaks this bootseer's env file contract: an older
    plugin (or newer hooks) gives jobs no ``BOOTSEER_*`` variables."""
    from bootseer.nodepaths import ENV_CONTRACT

    name = "plugin"
    try:
        where, plugin = _plugin_file(node)
    except SlurmConfError as exc:
        return skip(name, f"{exc} (see plugstack)")
    if plugin is None:
        return skip(name, "no installed bootseer.so to look at (see plugstack)")
    contract = plugin_contract(plugin)
    reinstall = f"{install_fix(node)} (bootseer and its plugin together), then restart slurmd"
    if contract is None:
        return problem(
            name,
            f"{plugin} ({where}) predates the env file contract this bootseer's hooks "
            f"write ({ENV_CONTRACT}); one that reads the file as the job's user cannot: "
            "jobs get no BOOTSEER_* variables, and nothing says why",
            reinstall,
        )
    if contract != ENV_CONTRACT:
        return problem(
            name,
            f"{plugin} reads env file contract {contract}, this bootseer's hooks write "
            f"{ENV_CONTRACT}: jobs get no BOOTSEER_* variables (the plugin says so in "
            "their stderr)",
            reinstall,
        )
    return ok(name, f"{plugin}: env file contract {contract}, as this bootseer's hooks")


def check_hooks(node: Node) -> Check:
    """slurm.conf runs bootseer's Prolog and Epilog, the Prolog at allocation."""
    name = "prolog"
    try:
        conf = node.slurm
    except SlurmConfError as exc:
        return problem(name, str(exc), "set $SLURM_CONF to the node's slurm.conf")
    missing = []
    for hook in HOOKS:
        if not _runs_hook(conf.get(hook, ""), f"bootseer-{hook}"):
            what = conf.get(hook) or "unset"
            missing.append(f"{hook.capitalize()} ({what}) does not run bootseer-{hook}")
    if missing:
        return problem(
            name,
            f"{node.slurm_conf}: " + "; ".join(missing),
            "set Prolog= and Epilog= to bootseer's hooks (README: Installing)",
        )
    flags = conf.get("prologflags", "")
    if not has_alloc(flags):
        new = f"{flags},Alloc" if flags else "Alloc"
        return problem(
            name,
            f"{node.slurm_conf}: PrologFlags={flags or '(unset)'} lacks Alloc: "
            "the prolog runs only at a job's first step",
            f"PrologFlags={new} (keep the flags already there)",
        )
    return ok(name, f"Prolog, Epilog; PrologFlags={flags}")


def _runs_hook(value: str, script: str) -> bool:
    """Whether slurm.conf's ``Prolog=VALUE`` (paths, globs, commas) runs ``script``,
    itself or a wrapper that names it."""
    for pattern in filter(None, (v.strip() for v in value.split(","))):
        for name in glob.glob(pattern) or [pattern]:
            path = Path(name)
            if not os.access(path, os.X_OK) or not path.is_file():
                continue
            if path.name == script:
                return True
            try:
                with path.open("rb") as f:
                    if script.encode() in f.read(1 << 16):
                        return True
            except OSError:
                continue
    return False


@needs_config("timeout")
def check_timeout(node: Node) -> Check:
    """``PrologEpilogTimeout`` leaves the hooks their deadlines and some."""
    name = "timeout"
    assert node.cfg is not None
    try:
        value = node.slurm.get("prologepilogtimeout", "")
    except SlurmConfError as exc:
        return problem(name, str(exc), "set $SLURM_CONF to the node's slurm.conf")
    need = max(node.cfg.hooks.prolog_deadline, node.cfg.hooks.epilog_deadline)
    if not value:
        return ok(name, f"PrologEpilogTimeout unset (Slurm waits); deadlines {need:g}s")
    try:
        timeout = float(value)
    except ValueError:
        return problem(name, f"PrologEpilogTimeout={value} is not a number", "fix slurm.conf")
    if timeout < need + TIMEOUT_MARGIN:
        return problem(
            name,
            f"PrologEpilogTimeout={value} leaves the hooks' {need:g}s deadline no room: "
            "a hook slurmd kills drains the node",
            f"PrologEpilogTimeout={need + 2 * TIMEOUT_MARGIN:.0f} or lower "
            "hooks.prolog_deadline/epilog_deadline",
        )
    return ok(name, f"PrologEpilogTimeout={value}s > the hooks' {need:g}s deadline")
