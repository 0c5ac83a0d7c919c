"""What the checks look at: this node's name, its slurm.conf and its site config."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from bootseer.doctor.result import Check, skip
from bootseer.errors import ConfigError
from bootseer.slurm.conf import read_slurm_conf, slurm_conf_path

if TYPE_CHECKING:
    from bootseer.config import SiteConfig
    from bootseer.store import Store

# A login shell's PATH (Debian's /etc/login.defs ENV_PATH): what jobs inherit from sbatch.
USER_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass
class Node:
    """What the checks look at: this node's name, its slurm.conf and its site config
    (None with ``config_error`` saying why, when it cannot be used: a
    :class:`~bootseer.errors.NoSiteConfig` when there is none)."""

    name: str
    slurm_conf: Path
    config_path: Path
    cfg: SiteConfig | None
    config_error: ConfigError | None = None
    python: Path = field(default_factory=lambda: Path(sys.executable))
    user_path: str = USER_PATH

    @classmethod
    def here(cls, node: str | None = None) -> Node:
        """This node as its environment describes it (``$SLURM_CONF``, ``$BOOTSEER_CONFIG``)."""
        from bootseer.config import config_path, load_config
        from bootseer.nodepaths import node_name

        name = node or node_name()
        path = config_path()
        cfg: SiteConfig | None = None
        error: ConfigError | None = None
        try:
            cfg = load_config(path).for_node(name)
        except ConfigError as exc:
            error = exc
        return cls(name, slurm_conf_path(), path, cfg, error)

    @cached_property
    def slurm(self) -> dict[str, str]:
        """slurm.conf's settings (raises :class:`~bootseer.slurm.conf.SlurmConfError`)."""
        return read_slurm_conf(self.slurm_conf)

    @cached_property
    def store(self) -> Store:
        """The configured store, opened without creating it (raises BootseerError)."""
        assert self.cfg is not None
        return self.cfg.store.open(create=False)


CheckFn = Callable[[Node], Check]


def needs_config(name: str) -> Callable[[CheckFn], CheckFn]:
    """A check that cannot tell without a usable site config skips, saying so."""

    def wrap(fn: CheckFn) -> CheckFn:
        def run(node: Node) -> Check:
            if node.cfg is None:
                return skip(name, "needs a usable site config (see config)")
            return fn(node)

        run.__name__ = run.__qualname__ = fn.__name__
        run.__doc__ = fn.__doc__
        return run

    return wrap
