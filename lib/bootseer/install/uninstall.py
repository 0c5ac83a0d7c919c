"""``bootseer uninstall NODESET``: an install taken back, in the order that breaks nothing.

First Slurm's own files: while a plugstack line names the plugin, removing it fails every
``sbatch`` and ``srun`` on the host; while slurm.conf's ``Prolog``/``Epilog`` name the
hooks, removing them fails every job's prolog there (Slurm drains the node). bootseer
never edits either file, so a node whose Slurm configuration (``--slurm-etc``, default
``/etc/slurm``) still names them is refused, naming the file and line: the admin takes the
lines out (and restarts slurmd), then runs the uninstall again. Then the agent (stopped
and disabled where systemd runs), then the files: the unit, the hooks, the plugin, the
venvs, the wheels, the docs, the config, the site key and store secrets it names, and the
``bootseer`` link where it is this install's; directories left empty go too.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from bootseer.install.layout import Layout
from bootseer.install.node import NodeReport
from bootseer.install.remote import Node

# Which files under the Slurm configuration directory name one of the paths (stdin, one a
# line): "file:line: text" for each, at most 20.
FIND = r"""
set -e
[ -d "$1" ] || exit 0
grep -rnF -f /dev/stdin -- "$1" 2>/dev/null |
  grep -v '^[^:]*:[0-9]*:[[:space:]]*#' | head -20 || true
"""

REMOVE = r"""
set -e
unit=$1 bin=$2 want=$3; shift 3
if [ -n "$unit" ] && [ -e "$unit" ]; then
  if [ -d /run/systemd/system ]; then
    systemctl disable --now bootseer-agent.service >/dev/null 2>&1 || true
  fi
  rm -f -- "$unit"
  [ ! -d /run/systemd/system ] || systemctl daemon-reload
fi
if [ -n "$bin" ] && [ "$(readlink "$bin" 2>/dev/null)" = "$want" ]; then rm -f -- "$bin"; fi
for p in "$@"; do
  if [ -e "$p" ] || [ -L "$p" ]; then echo "$p"; rm -rf -- "$p"; fi
done
"""


def uninstall_paths(lay: Layout, key_file: Path, secrets_file: Path) -> list[Path]:
    """What an install put on a node (``lay`` resolved for it), the unit and link aside."""
    return [
        lay.hook("prolog"),
        lay.hook("epilog"),
        lay.libexec,
        lay.plugin,
        lay.prefix / "share" / "bootseer",
        lay.docs,
        lay.venv,
        lay.venvs,
        lay.wheels,
        lay.state,
        lay.previous,
        lay.config,
        key_file,
        secrets_file,
    ]


def uninstall_node(
    node: Node,
    lay: Layout,
    key_file: Path,
    secrets_file: Path,
    slurm_etc: Path,
    dry_run: bool = False,
) -> NodeReport:
    """Refused (a failed report) while ``slurm_etc`` names the plugin or the hooks."""
    named = "\n".join(str(p) for p in (lay.plugin, lay.hook("prolog"), lay.hook("epilog")))
    found = node.check(["sh", "-c", FIND, "-", str(slurm_etc)], stdin=named.encode() + b"\n")
    lines = [x for x in found.splitlines() if x.strip()]
    if lines:
        where = "; ".join(x[:200] for x in lines[:3])
        more = f" (+{len(lines) - 3} more)" if len(lines) > 3 else ""
        return NodeReport(
            node.name,
            "failed",
            error=f"Slurm still runs bootseer here: {where}{more}: take those lines out "
            "everywhere first (plugstack's, then slurm.conf's Prolog/Epilog), restart slurmd, "
            "and uninstall again; nothing was removed",
        )
    paths = uninstall_paths(lay, key_file, secrets_file)
    unit = str(lay.unit) if lay.unit is not None else ""
    bin_link = str(lay.bin_dir / "bootseer") if lay.bin_dir is not None else ""
    if dry_run:
        listing = " ".join(shlex.quote(str(p)) for p in [*paths, *filter(None, [unit])])
        script = f'for p in {listing}; do [ ! -e "$p" ] || echo "$p"; done'
        gone = node.check(["sh", "-c", script]).split()
        changes = [f"{len(gone)} paths removed"] if gone else []
        return NodeReport(node.name, "would change" if gone else "unchanged", changes)
    out = node.check(["sh", "-c", REMOVE, "-", unit, bin_link, str(lay.bootseer), *map(str, paths)])
    removed = out.split()
    # Directories of the install's own left empty (never the prefix's or etc's parents).
    for d in (lay.prefix / "share" / "doc", lay.prefix / "share", lay.prefix / "lib" / "slurm",
              lay.prefix / "lib", lay.prefix, lay.etc):  # fmt: skip
        node.run(["rmdir", "--", str(d)])
    if not removed:
        return NodeReport(node.name, "unchanged", notes=["nothing of bootseer here"])
    return NodeReport(node.name, "removed", [f"{len(removed)} paths"])
