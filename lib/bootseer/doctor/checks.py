"""Every check, in the order ``bootseer doctor`` prints them, and running them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from bootseer.doctor.agent import check_agent, check_metrics, check_p2p, check_stale_jobs
from bootseer.doctor.files import check_config, check_site_key, check_store_secrets
from bootseer.doctor.host import check_fuse, check_path, check_python
from bootseer.doctor.launch import check_step_launch
from bootseer.doctor.node import CheckFn, Node
from bootseer.doctor.result import Check, problem
from bootseer.doctor.slurmd import check_hooks, check_plugin, check_plugstack, check_timeout
from bootseer.doctor.store import (
    check_clock,
    check_phase_privacy,
    check_store,
    check_store_exposure,
)
from bootseer.errors import BootseerError, describe
from bootseer.slurm.conf import SLURM_CONF

if TYPE_CHECKING:
    from bootseer.config import SiteConfig

CHECKS: tuple[CheckFn, ...] = (
    check_config,
    check_plugstack,
    check_plugin,
    check_hooks,
    check_timeout,
    check_step_launch,
    check_agent,
    check_stale_jobs,
    check_fuse,
    check_store,
    check_store_exposure,
    check_phase_privacy,
    check_clock,
    check_site_key,
    check_p2p,
    check_store_secrets,
    check_metrics,
    check_python,
    check_path,
)


def run_checks(node: Node, checks: tuple[CheckFn, ...] = CHECKS) -> list[Check]:
    """Every check's answer; a check that raises is a problem naming the error."""
    out = []
    for fn in checks:
        try:
            out.append(fn(node))
        except (OSError, BootseerError) as exc:
            out.append(problem(fn.__name__.removeprefix("check_"), describe(exc), "see the error"))
    return out


def store_check(cfg: SiteConfig, config_path: Path) -> Check:
    """The store alone (``bootseer config --check``)."""
    return check_store(Node("", SLURM_CONF, config_path, cfg))
