"""The one parser of slurm.conf's text and the one of ``scontrol show config``'s output.

slurm.conf is read as slurmd reads it: keys case-insensitive (lower-cased here), the
last setting winning, ``Include`` files read in place; a node's or partition's line
(several ``key=value`` pairs) is not a setting. ``scontrol show config`` prints the
running Slurm's ``Key = value`` lines, keys as Slurm spells them::

    >>> conf = parse_slurm_conf("Prolog=/p\\nPrologFlags=X11,Contain # the site's\\n")
    >>> conf["prologflags"], has_alloc(conf["prologflags"]), has_alloc("X11")
    ('X11,Contain', True, False)
    >>> parse_show_config("Configuration data as of today\\nPrologFlags = Alloc\\n")
    {'PrologFlags': 'Alloc'}

What bootseer's hooks need of slurm.conf is here too, for ``bootseer doctor`` to check
and ``bootseer install`` to ask for: a Prolog run at allocation (:func:`has_alloc`), a
``PrologEpilogTimeout`` past their deadlines by :data:`TIMEOUT_MARGIN`, and steps that
wait for every node's prolog (:func:`defers_batch`, :func:`launch_wait`)::

    >>> defers_batch("Alloc,DeferBatch"), defers_batch("Contain,DeferBatch,NoHold")
    (True, False)
    >>> launch_wait({"messagetimeout": "30"}), launch_wait({})
    (40.0, 20.0)

How Slurm 22.05 holds a job's steps while a node's prolog runs (``PrologFlags=Alloc``):
slurmd answers a step's task launch only once the job's prolog there has ended
(``_rpc_launch_tasks`` -> ``_wait_for_job_running_prolog``), and srun waits for that
answer ``MessageTimeout + BatchStartTimeout`` seconds (``_launch_tasks``), then gives up
on the node ("Task launch for StepId=... failed on node n2: Socket timed out"): the
step runs without that node's tasks. A batch script starts once its own node's prolog
is done, so its first ``srun`` meets the others' still running. ``DeferBatch`` makes
slurmctld send the batch launch only when every node has said its prolog completed
(``prolog_complete``, the bits of ``node_bitmap_pr``; ``_batch_launch_defer``), and
``NoHold`` undoes it (no node waits to be heard from). salloc waits too (its
``_wait_nodes_ready`` polls until no node's prolog runs, up to 300 s); a step launched
while a prolog still runs (srun making its own allocation) waits
:func:`launch_wait`, which must outlast the prolog's deadline.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from bootseer.errors import BootseerError

SLURM_CONF = Path("/etc/slurm/slurm.conf")
TIMEOUT_MARGIN = 10.0  # seconds PrologEpilogTimeout should leave past a hook's deadline
# slurm.conf lines that hold several key=value pairs of a node or partition, not settings.
_MULTI = ("nodename", "partitionname", "nodeset", "frontendname", "downnodes", "switchname")


class SlurmConfError(BootseerError):
    """A Slurm configuration file is missing or unreadable (the message names it)."""


def slurm_conf_path() -> Path:
    """The slurm.conf Slurm's commands read here: ``$SLURM_CONF``, else the default."""
    return Path(os.environ.get("SLURM_CONF") or SLURM_CONF)


def read_file(path: Path) -> str:
    """A Slurm configuration file's text (raises :class:`SlurmConfError`)."""
    try:
        return path.read_text(errors="replace")
    except OSError as exc:
        raise SlurmConfError(f"cannot read {path}: {exc.strerror}") from None


def read_slurm_conf(path: Path) -> dict[str, str]:
    """The settings of the slurm.conf at ``path``, its ``Include`` files relative to it."""
    return parse_slurm_conf(read_file(path), path.parent)


def parse_slurm_conf(text: str, base: Path | None = None, depth: int = 0) -> dict[str, str]:
    """slurm.conf's settings, keys lower-cased (Slurm's are case-insensitive), the last
    one winning; ``Include`` files (relative to ``base``) are read in place."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        word, _, rest = line.partition(" ")
        if word.lower() == "include" and "=" not in word and base is not None and depth < 8:
            for name in sorted(glob.glob(str(base / rest.strip()))):
                out.update(parse_slurm_conf(read_file(Path(name)), base, depth + 1))
            continue
        key, eq, value = line.partition("=")
        if eq and key.strip().lower() not in _MULTI:
            out[key.strip().lower()] = value.strip().strip('"')
    return out


def has_alloc(flags: str) -> bool:
    """Whether ``PrologFlags`` runs the Prolog at allocation (``Contain`` implies ``Alloc``)."""
    return bool({f.strip().lower() for f in flags.split(",")} & {"alloc", "contain", "runinjob"})


def prolog_flags(flags: str) -> set[str]:
    """``PrologFlags``' flags, lower-cased (Slurm reads them case-insensitively)."""
    return {f.strip().lower() for f in flags.split(",") if f.strip()}


def defers_batch(flags: str) -> bool:
    """Whether a batch script waits for every node's prolog: ``DeferBatch`` without
    ``NoHold`` (with which slurmctld hears from no node's prolog)."""
    have = prolog_flags(flags)
    return "deferbatch" in have and "nohold" not in have


# Slurm 22.05's defaults (src/common/read_config.h), where slurm.conf sets none.
MESSAGE_TIMEOUT = 10.0
BATCH_START_TIMEOUT = 10.0


def launch_wait(conf: dict[str, str]) -> float:
    """How long srun waits for a node to start a step's tasks while the job's prolog
    still runs there: ``MessageTimeout + BatchStartTimeout`` (raises
    :class:`SlurmConfError` for a value that is not a number)."""
    total = 0.0
    for name, default in (
        ("MessageTimeout", MESSAGE_TIMEOUT),
        ("BatchStartTimeout", BATCH_START_TIMEOUT),
    ):
        value = conf.get(name.lower(), "")
        try:
            total += float(value) if value else default
        except ValueError:
            raise SlurmConfError(f"slurm.conf: {name}={value} is not a number") from None
    return total


def parse_show_config(text: str) -> dict[str, str]:
    """``Key = value`` lines of ``scontrol show config``; other lines are skipped."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(" = ")
        if sep and key.strip() and " " not in key.strip():
            out.setdefault(key.strip(), value.strip())
    return out
