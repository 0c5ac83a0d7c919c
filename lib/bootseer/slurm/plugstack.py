"""plugstack.conf: the SPANK plugins slurmd and srun load, and their arguments.

>>> parse_plugstack_line("required /usr/lib/slurm/bootseer.so rundir=/run/bootseer")
('required', '/usr/lib/slurm/bootseer.so', ('rundir=/run/bootseer',))
"""

from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from bootseer.choices import one_of
from bootseer.slurm.conf import read_file

PLUGIN = "bootseer.so"
PLUGIN_RUNDIR = "/run/bootseer"  # spank/bootseer.c's default rundir=

# Whether a plugin that fails to load fails the job (required) or is skipped (optional).
Need = Literal["required", "optional"]
NEEDS: tuple[Need, ...] = get_args(Need)


def parse_plugstack_line(line: str) -> tuple[Need, str, tuple[str, ...]] | None:
    """``(required|optional, plugin, args)`` of one plugstack.conf line, or None."""
    words = line.split("#", 1)[0].split()
    need = one_of(words[0], NEEDS) if words else None
    if len(words) < 2 or need is None:
        return None
    return need, words[1], tuple(words[2:])


@dataclass(frozen=True)
class PlugstackEntry:
    source: Path
    lineno: int
    kind: Need
    plugin: str
    args: tuple[str, ...]

    @property
    def rundir(self) -> str:
        """The plugin's ``rundir=`` (its default when absent; the last one wins)."""
        found = [a[len("rundir=") :] for a in self.args if a.startswith("rundir=")]
        return found[-1] if found else PLUGIN_RUNDIR


def parse_plugstack(path: Path, depth: int = 0) -> list[PlugstackEntry]:
    """Every plugin line of ``path`` and of the files its ``include`` lines name
    (raises :class:`~bootseer.slurm.conf.SlurmConfError`)."""
    out: list[PlugstackEntry] = []
    for n, line in enumerate(read_file(path).splitlines(), start=1):
        words = line.split("#", 1)[0].split()
        if len(words) == 2 and words[0] == "include" and depth < 8:
            pattern = words[1] if words[1].startswith("/") else str(path.parent / words[1])
            for name in sorted(glob.glob(pattern)):
                out += parse_plugstack(Path(name), depth + 1)
            continue
        parsed = parse_plugstack_line(line)
        if parsed:
            out.append(PlugstackEntry(path, n, *parsed))
    return out


def plugstack_path(conf: dict[str, str], slurm_conf: Path) -> Path:
    """``PlugStackConfig``, or plugstack.conf next to slurm.conf (Slurm's default)."""
    return Path(conf.get("plugstackconfig") or slurm_conf.parent / "plugstack.conf")
