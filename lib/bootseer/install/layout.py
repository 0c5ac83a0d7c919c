"""Where an install puts things on a node.

A real node takes the defaults (``/opt/bootseer``, ``/etc/bootseer``, the unit in
``/etc/systemd/system``, a ``bootseer`` link in ``/usr/local/bin`` for jobs' PATH).
Every path may hold ``%n``, the node's name: slurm-dev's nodes share one filesystem,
so each gets a prefix of its own (``<state>/nodes/%n/...``) and the paths written into
its venv, hook wrappers and unit are the real ones on that node.

    >>> Layout(prefix="/x/%n/opt").for_node("n2").plugin
    PosixPath('/x/n2/opt/lib/slurm/bootseer.so')
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bootseer.stepapi import Hook

# What a host is to Slurm, and so what it gets: a compute node runs jobs (everything:
# the hooks, the agent and its unit, the plugin, the CLI, the config with the site key
# and store secrets); a client, a submit or login host, runs sbatch and the CLI (the
# plugin, the CLI's venv and link, the docs and the config: no agent, no hooks, no
# root-only files).
Role = Literal["compute", "client"]
ROLES: tuple[Role, ...] = ("compute", "client")


@dataclass(frozen=True)
class Layout:
    prefix: Path = Path("/opt/bootseer")
    etc: Path = Path("/etc/bootseer")
    unit_dir: Path | None = Path("/etc/systemd/system")  # None: no unit (slurm-dev)
    bin_dir: Path | None = Path("/usr/local/bin")  # None: no link on users' PATH

    def for_node(self, node: str) -> Layout:
        def sub(p: Path | None) -> Path | None:
            return None if p is None else Path(str(p).replace("%n", node))

        return dataclasses.replace(
            self,
            prefix=Path(str(self.prefix).replace("%n", node)),
            etc=Path(str(self.etc).replace("%n", node)),
            unit_dir=sub(self.unit_dir),
            bin_dir=sub(self.bin_dir),
        )

    @property
    def venv(self) -> Path:
        """A symlink to the current venv in ``venvs/`` (switched by one rename)."""
        return self.prefix / "venv"

    @property
    def venvs(self) -> Path:
        return self.prefix / "venvs"

    @property
    def wheels(self) -> Path:
        return self.prefix / "wheels"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python3"

    @property
    def bootseer(self) -> Path:
        return self.venv / "bin" / "bootseer"

    @property
    def libexec(self) -> Path:
        return self.prefix / "libexec"

    def hook(self, hook: Hook) -> Path:
        """What slurm.conf's Prolog/Epilog name: a wrapper naming this install's paths."""
        return self.libexec / f"bootseer-{hook}"

    def hook_script(self, hook: Hook) -> Path:
        return self.prefix / "share" / "bootseer" / hook / f"bootseer-{hook}"

    @property
    def plugin(self) -> Path:
        return self.prefix / "lib" / "slurm" / "bootseer.so"

    @property
    def docs(self) -> Path:
        return self.prefix / "share" / "doc" / "bootseer"

    @property
    def config(self) -> Path:
        return self.etc / "config.toml"

    @property
    def unit(self) -> Path | None:
        return None if self.unit_dir is None else self.unit_dir / "bootseer-agent.service"

    @property
    def state(self) -> Path:
        """What the last install put here (digests), for the next run to compare."""
        return self.prefix / "install.json"

    @property
    def previous(self) -> Path:
        """The version before this one, kept for a rollback (install.releases)."""
        return self.prefix / "previous"
