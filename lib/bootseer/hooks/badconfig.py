"""A hook that finds the site config unusable says so where an admin looks.

Slurm drops the prolog's output, so a message on stderr alone reaches nobody. The job
starts without bootseer all the same (no step runs on a config with a bad line), and
the hook records the problem from what it can still trust of the file
(:func:`salvage`: every key that is valid on its own):

- the hook's own phase row failed with the problem as its detail and, from the prolog,
  a ``site_config`` row (failed, the problem as its detail), so ``bootseer report JOB``
  names it, when the file still names the store (never the defaults' node-local one);
- a line in the node's hook log, when it still names a log dir;
- ``bootseer_hook_runs_total{outcome="config_error"}`` and
  ``bootseer_hook_config_error 1`` in the metrics, when it still names their directory.

    >>> record_bad_config("prolog", os.environ, "n1", ConfigError("..."), began)  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bootseer.config import SiteConfig, config_path
from bootseer.errors import BootseerError
from bootseer.stepapi import Hook, StepRow

PHASE = "site_config"
MAX_LINES_DROPPED = 20  # TOML syntax errors skipped before the file counts as lost
_AT_LINE = re.compile(r"\(at line (\d+), column \d+\)")


@dataclasses.dataclass(frozen=True)
class Salvage:
    cfg: SiteConfig
    keys: frozenset[str]  # "section.key" of every value kept from the file

    def has(self, key: str) -> bool:
        return key in self.keys


def salvage(path: Path) -> Salvage | None:
    """The keys of the config at ``path`` that are valid on their own (lines that are
    not TOML skipped; a section whose keys disagree with each other dropped whole);
    None when nothing of it can be read."""
    try:
        lines = path.read_bytes().decode(errors="replace").splitlines()
    except OSError:
        return None
    data: dict[str, Any] | None = None
    for _ in range(MAX_LINES_DROPPED):
        try:
            data = tomllib.loads("\n".join(lines))
            break
        except tomllib.TOMLDecodeError as exc:
            m = _AT_LINE.search(str(exc))
            n = int(m.group(1)) - 1 if m else -1
            if not 0 <= n < len(lines) or lines[n].startswith("#"):
                return None
            lines[n] = "#" + lines[n]
    if data is None:
        return None
    good: dict[str, dict[str, Any]] = {}
    for section, table in data.items():
        if not isinstance(table, Mapping):
            continue
        for key, value in table.items():
            try:
                SiteConfig.from_mapping({section: {key: value}})
            except (BootseerError, TypeError, ValueError):
                continue
            good.setdefault(section, {})[key] = value
    for section in list(good):
        try:
            SiteConfig.from_mapping({section: good[section]})
        except (BootseerError, TypeError, ValueError):
            del good[section]
    try:
        cfg = SiteConfig.from_mapping(good, source=path)
    except (BootseerError, TypeError, ValueError):
        return None
    keys = frozenset(f"{s}.{k}" for s, table in good.items() for k in table)
    return Salvage(cfg, keys)


def record_bad_config(
    hook: Hook, env: Mapping[str, str], node: str, problem: BootseerError, began: float
) -> None:
    """Record ``problem`` (the site config would not load) for this hook run, each
    record only where the salvaged config still names its place. Never raises."""
    from bootseer.context import JobContext
    from bootseer.hooks.log import HookLog

    path = config_path()
    found = salvage(path)
    if found is None:
        return
    cfg = found.cfg.for_node(node)
    job = env.get("SLURM_JOB_ID", "?")
    log: Callable[[str], object] = lambda _: None  # noqa: E731
    hook_log = None
    if found.has("paths.log_dir"):
        try:
            hook_log = HookLog(cfg.paths.log_dir, node, job, hook)
            log = hook_log
        except OSError:
            pass
    log(f"outcome=config_error: {problem}; job {job} starts without bootseer on this node")
    now = time.time()
    seconds = max(0.0, time.monotonic() - began)
    if found.has("metrics.textfile_dir"):
        from bootseer.metrics.hooks import HookSample, record

        record(cfg.metrics.textfile_dir, HookSample(hook, "config_error", seconds), log)
    if found.has("store.uri") and cfg.phases.enabled:
        try:
            ctx = JobContext.from_env(env)
        except BootseerError as exc:
            log(f"phase records not written: {exc}")
        else:
            why = f"site config unusable, no step ran: {problem}"
            rows = [StepRow(hook, now - seconds, now, "failed", detail=why)]
            if hook == "prolog":  # one site_config row a node: the report spans a phase's rows
                rows.append(StepRow(PHASE, now - seconds, now, "failed", detail=str(problem)))
            # The detached flush would load the same bad file: the rows go inline.
            inline = dataclasses.replace(
                cfg, phases=dataclasses.replace(cfg.phases, background_flush=False)
            )
            left = cfg.hook_deadline(hook) - (time.monotonic() - began)
            _record_until(hook, ctx, inline, rows, log, max(0.0, left))
    if hook_log is not None:
        hook_log.close()


def _record_until(
    hook: Hook,
    ctx: Any,
    cfg: SiteConfig,
    rows: list[StepRow],
    log: Callable[[str], object],
    seconds: float,
) -> None:
    """The rows, written in a thread waited for ``seconds`` at most (a store that hangs
    must not keep the hook past its deadline: a killed epilog drains the node)."""
    from bootseer.phases import hooks as phase_hooks

    failed: list[BaseException] = []

    def write() -> None:
        try:
            phase_hooks.record_hook_run(hook, ctx, cfg, rows, log)
        except BaseException as exc:
            failed.append(exc)

    worker = threading.Thread(target=write, name=f"{hook}-records", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        log(f"phase records not written: no answer from the store within {seconds:g}s")
    elif failed:
        log(f"phase records not written: {failed[0]!r}")
