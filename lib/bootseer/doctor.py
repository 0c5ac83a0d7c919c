"""``bootseer doctor``: what is wrong with this node, and what to change.

A pre-flight in the spirit of ``enroot-check``: each check is a small function taking a
:class:`Node` (the site config, slurm.conf and the node's name) and returning one
:class:`Check`, ``ok``, ``problem`` (with what to change) or ``skip`` (it cannot tell).
The parsers of Slurm's files are plain functions, tested on their own::

    >>> conf = parse_slurm_conf("Prolog=/p\\nPrologFlags=X11,Contain # the site's\\n")
    >>> conf["prologflags"], has_alloc(conf["prologflags"]), has_alloc("X11")
    ('X11,Contain', True, False)
    >>> parse_plugstack_line("required /usr/lib/slurm/bootseer.so rundir=/run/bootseer")
    ('required', '/usr/lib/slurm/bootseer.so', ('rundir=/run/bootseer',))

Nothing here runs at import beyond the standard library; the store check imports pyarrow.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import stat
import sys
import tarfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bootseer.errors import BootseerError, ConfigError
from bootseer.rootfile import root_only

if TYPE_CHECKING:
    from bootseer.config import SiteConfig
    from bootseer.store import Store

OK, PROBLEM, SKIP = "ok", "problem", "skip"
SLURM_CONF = Path("/etc/slurm/slurm.conf")
PLUGIN = "bootseer.so"
PLUGIN_RUNDIR = "/run/bootseer"  # spank/bootseer.c's default rundir=
# A login shell's PATH (Debian's /etc/login.defs ENV_PATH): what jobs inherit from sbatch.
USER_PATH = "/usr/local/bin:/usr/bin:/bin"
PYTHON_MIN = (3, 11)  # pyproject's requires-python
TIMEOUT_MARGIN = 10.0  # seconds PrologEpilogTimeout should leave past a hook's deadline
CLOCK_SKEW = 5.0  # seconds between this node and the store's time that we tolerate
# slurm.conf lines that hold several key=value pairs of a node or partition, not settings.
_MULTI = ("nodename", "partitionname", "nodeset", "frontendname", "downnodes", "switchname")


@dataclass(frozen=True)
class Check:
    """One check's answer: ``detail`` says what it found, ``fix`` what to change."""

    name: str
    status: str
    detail: str
    fix: str = ""

    @property
    def ok(self) -> bool:
        return self.status != PROBLEM

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


def ok(name: str, detail: str) -> Check:
    return Check(name, OK, detail)


def problem(name: str, detail: str, fix: str) -> Check:
    return Check(name, PROBLEM, detail, fix)


def skip(name: str, detail: str) -> Check:
    return Check(name, SKIP, detail)


class DoctorError(BootseerError):
    """A file doctor reads is missing or unreadable (the check that needed it says so)."""


# -- Slurm's files ---------------------------------------------------------------------


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
                out.update(parse_slurm_conf(_read(Path(name)), base, depth + 1))
            continue
        key, eq, value = line.partition("=")
        if eq and key.strip().lower() not in _MULTI:
            out[key.strip().lower()] = value.strip().strip('"')
    return out


def has_alloc(flags: str) -> bool:
    """Whether ``PrologFlags`` runs the Prolog at allocation (``Contain`` implies ``Alloc``)."""
    return bool({f.strip().lower() for f in flags.split(",")} & {"alloc", "contain", "runinjob"})


def parse_plugstack_line(line: str) -> tuple[str, str, tuple[str, ...]] | None:
    """``(required|optional, plugin, args)`` of one plugstack.conf line, or None."""
    words = line.split("#", 1)[0].split()
    if len(words) < 2 or words[0] not in ("required", "optional"):
        return None
    return words[0], words[1], tuple(words[2:])


@dataclass(frozen=True)
class PlugstackEntry:
    source: Path
    lineno: int
    kind: str
    plugin: str
    args: tuple[str, ...]

    @property
    def rundir(self) -> str:
        """The plugin's ``rundir=`` (its default when absent; the last one wins)."""
        found = [a[len("rundir=") :] for a in self.args if a.startswith("rundir=")]
        return found[-1] if found else PLUGIN_RUNDIR


def parse_plugstack(path: Path, depth: int = 0) -> list[PlugstackEntry]:
    """Every plugin line of ``path`` and of the files its ``include`` lines name."""
    out: list[PlugstackEntry] = []
    for n, line in enumerate(_read(path).splitlines(), start=1):
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


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError as exc:
        raise DoctorError(f"cannot read {path}: {exc.strerror}") from None


# -- the node --------------------------------------------------------------------------


@dataclass
class Node:
    """What the checks look at: this node's name, its slurm.conf and its site config
    (None with ``config_error`` saying why, when it cannot be used)."""

    name: str
    slurm_conf: Path
    config_path: Path
    cfg: SiteConfig | None
    config_error: str = ""
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
        error = ""
        if not path.exists():
            error = f"no site config at {path}"
        else:
            try:
                cfg = load_config(path).for_node(name)
            except ConfigError as exc:
                error = str(exc)
        slurm_conf = Path(os.environ.get("SLURM_CONF") or SLURM_CONF)
        return cls(name, slurm_conf, path, cfg, error)

    @cached_property
    def slurm(self) -> dict[str, str]:
        return parse_slurm_conf(_read(self.slurm_conf), self.slurm_conf.parent)

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


# -- the checks ------------------------------------------------------------------------


def check_config(node: Node) -> Check:
    """The site config exists, parses, is readable by users and writable by root alone."""
    name = "config"
    if node.cfg is None:
        if node.config_error.startswith("no site config"):
            return problem(
                name,
                f"{node.config_error} (bootseer would use defaults: a node-local store)",
                f"write {node.config_path} (README: Site config) or set $BOOTSEER_CONFIG",
            )
        return problem(name, node.config_error, f"fix {node.config_path}")
    st = os.stat(node.config_path)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != 0 or mode & 0o022:
        return problem(
            name,
            f"{node.config_path}: uid {st.st_uid}, mode {mode:04o}: others may change it",
            f"chown root {node.config_path}; chmod 0644 {node.config_path}",
        )
    if not mode & 0o004:
        return problem(
            name,
            f"{node.config_path}: mode {mode:04o}: users' bootseer cannot read it",
            f"chmod 0644 {node.config_path} (secrets belong in [site] key_file)",
        )
    return ok(name, f"{node.config_path} (mode {mode:04o})")


@needs_config("plugstack")
def check_plugstack(node: Node) -> Check:
    """The SPANK plugin is in plugstack.conf and its ``rundir=`` is the config's run_dir."""
    name = "plugstack"
    assert node.cfg is not None
    try:
        path = plugstack_path(node.slurm, node.slurm_conf)
        entries = [e for e in parse_plugstack(path) if Path(e.plugin).name == PLUGIN]
    except DoctorError as exc:
        return problem(name, str(exc), f"add PlugStackConfig to {node.slurm_conf}")
    line = f"required /usr/local/lib/slurm/{PLUGIN} rundir={node.cfg.paths.run_dir}"
    if not entries:
        return problem(name, f"{path}: no {PLUGIN} line", f"add: {line}")
    e = entries[-1]
    where = f"{e.source}:{e.lineno}"
    if e.plugin.startswith("/") and not os.path.isfile(e.plugin):
        return problem(name, f"{where}: {e.plugin} does not exist", "make -C spank install")
    from bootseer.nodepaths import expand

    rundir = os.path.normpath(expand(e.rundir, node.name))
    run_dir = os.path.normpath(node.cfg.paths.run_dir)
    if rundir != run_dir:
        template = node.cfg.template.paths.run_dir if node.cfg.template else run_dir
        return problem(
            name,
            f"{where}: rundir={e.rundir} is not paths.run_dir {template}: "
            "jobs get no BOOTSEER_* variables",
            f"set rundir={template} in {where}, or paths.run_dir in {node.config_path}",
        )
    return ok(name, f"{where}: {e.kind} {Path(e.plugin).name} rundir={e.rundir}")


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
    except DoctorError as exc:
        return skip(name, f"{exc} (see plugstack)")
    if plugin is None:
        return skip(name, "no installed bootseer.so to look at (see plugstack)")
    contract = plugin_contract(plugin)
    reinstall = (
        "install bootseer and its plugin together: bootseer install NODESET "
        "(or make -C spank install), then restart slurmd"
    )
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
    except DoctorError as exc:
        return problem(name, str(exc), "set $SLURM_CONF to the node's slurm.conf")
    missing = []
    for hook in ("prolog", "epilog"):
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
    except DoctorError as exc:
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


@needs_config("agent")
def check_agent(node: Node) -> Check:
    """The node agent answers ``ping`` on its socket, which users may reach, and runs
    the install this bootseer is (not the venv of before an upgrade)."""
    name = "agent"
    assert node.cfg is not None
    from bootseer.agentapi.client import AgentClient
    from bootseer.agentapi.jobs import Ping
    from bootseer.nodepaths import NodePaths

    paths = NodePaths(node.cfg)
    sock = paths.agent_socket
    fix = f"systemctl enable --now bootseer-agent; see {paths.agent_log(node.name)}"
    try:
        reply = AgentClient(sock).ask(Ping(), timeout=5)
    except BootseerError as exc:
        return problem(name, str(exc), fix)
    mode = stat.S_IMODE(os.stat(sock).st_mode)
    if mode & 0o006 != 0o006:
        return problem(
            name, f"{sock}: mode {mode:04o}: jobs cannot ask it", "restart bootseer-agent"
        )
    here = os.path.realpath(sys.prefix)
    if reply.prefix and reply.prefix != here:
        # After an upgrade: the agent keeps the venv it started from until it restarts.
        return problem(
            name,
            f"{sock}: the agent runs {reply.prefix}, this bootseer {here}: an older install",
            "bootseer agent --restart (on the node: once no job uses it), or "
            "bootseer install NODESET --restart-agents",
        )
    return ok(name, f"{sock}: node {reply.node}, pid {reply.pid}")


@needs_config("stale jobs")
def check_stale_jobs(node: Node) -> Check:
    """No job's state left on the node (job dir, prepared image, phase spool) of a job
    that Slurm no longer runs here: an epilog killed or never run (agent/sweep.py)."""
    name = "stale jobs"
    assert node.cfg is not None
    from bootseer.agent.sweep import find_stale
    from bootseer.agentapi.client import AgentClient
    from bootseer.agentapi.jobs import Stats
    from bootseer.nodepaths import NodePaths
    from bootseer.slurmjobs import SlurmUnavailable

    paths = NodePaths(node.cfg)
    prepared: list[int] = []
    with contextlib.suppress(BootseerError):  # the agent check says why it does not answer
        prepared = AgentClient(paths.agent_socket).ask(Stats(), timeout=5).jobs
    try:
        found, _, stale = find_stale(node.name, paths.run_dir, node.cfg.phases.squeue, prepared)
    except SlurmUnavailable as exc:
        return skip(name, f"cannot ask Slurm which jobs run on {node.name}: {exc}")
    if not stale:
        return ok(name, f"{len(found.parts)} jobs' state on the node, each a job Slurm runs here")
    jobs = "; ".join(f"{j} ({', '.join(found.parts[j])})" for j in stale[:10])
    more = f" and {len(stale) - 10} more" * (len(stale) > 10)
    interval = node.cfg.hooks.sweep_interval
    when = (
        f"the agent sweeps them within {2 * interval:g}s (hooks.sweep_interval) if it runs"
        if interval > 0
        else "set hooks.sweep_interval (0 turns the agent's sweep off)"
    )
    return problem(
        name,
        f"state of jobs Slurm no longer runs on {node.name} (an epilog killed or never "
        f"run; a job dir holds an agent restart): {jobs}{more}",
        when,
    )


def check_fuse(node: Node) -> Check:
    """Users can mount FUSE: /dev/fuse open to them, fusermount3 setuid root."""
    name = "fuse"
    try:
        st = os.stat("/dev/fuse")
    except OSError as exc:
        return problem(name, f"/dev/fuse: {exc.strerror}", "apt install fuse3; modprobe fuse")
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISCHR(st.st_mode) or mode & 0o006 != 0o006:
        return problem(
            name, f"/dev/fuse: mode {mode:04o}: users cannot mount", "chmod 0666 /dev/fuse"
        )
    found = shutil.which("fusermount3", path=node.user_path)
    if found is None:
        return problem(name, f"no fusermount3 on {node.user_path}", "apt install fuse3")
    st = os.stat(found)
    if st.st_uid != 0 or not st.st_mode & stat.S_ISUID:
        return problem(
            name, f"{found} is not setuid root: users cannot mount", f"chmod u+s {found}"
        )
    return ok(name, f"/dev/fuse {mode:04o}, {found} setuid root")


@needs_config("store")
def check_store(node: Node) -> Check:
    """The store is there (never created by looking) and, where it can tell, users
    cannot write it."""
    name = "store"
    assert node.cfg is not None
    uri = node.cfg.store.uri
    try:
        store = node.store
    except BootseerError as exc:
        return problem(
            name, str(exc), f"mount or create it, or fix store.uri in {node.config_path}"
        )
    if not store.is_local:
        return ok(name, f"{uri} answers")
    mode = stat.S_IMODE(os.stat(store.root).st_mode)
    if mode & 0o002:
        return problem(
            name,
            f"{store.root}: mode {mode:04o}: every user can write the store",
            f"chmod o-w {store.root} (users' records are refused, but they may delete)",
        )
    return ok(name, f"{uri} (mode {mode:04o})")


@needs_config("store exposure")
def check_store_exposure(node: Node) -> Check:
    """Without credentials, users reach the public phase records and nothing else: no
    snapshot, image record or block, no listing of them, no write (docs/security.md)."""
    name = "store exposure"
    assert node.cfg is not None
    try:
        store = node.store
    except BootseerError:
        return skip(name, "no store to probe")
    from bootseer.store.exposure import exposure

    found = exposure(store)
    if not found:
        who = "the anonymous identity" if not store.is_local else "other users"
        return ok(name, f"{who} reach phases/ only")
    fix = (
        f"chmod -R go-rwx the private tops of {store.root} (all but phases/)"
        if store.is_local
        else "give the anonymous identity read and list on <root>/phases/* only "
        "(docs/security.md, Who reads the store on S3)"
    )
    return problem(name, "; ".join(found), fix)


@needs_config("phase records")
def check_phase_privacy(node: Node) -> Check:
    """Phase records are public ([store] public_phases) only where Slurm shows every
    user's jobs to everyone: with ``PrivateData=jobs``, ``bootseer report`` must not show
    mallory alice's jobs, their failures and script paths (docs/security.md)."""
    name = "phase records"
    assert node.cfg is not None
    private = {p.strip().lower() for p in node.slurm.get("privatedata", "").split(",")}
    public = node.cfg.store.public_phases
    if "jobs" in private and public:
        return problem(
            name,
            f"Slurm keeps jobs private ({node.slurm_conf}: PrivateData="
            f"{node.slurm.get('privatedata')}), but [store] public_phases = true: every user "
            "reads every job's phase records (user, nodes, times, script path, why steps "
            "failed) with bootseer report",
            "set [store] public_phases = false in the site config (users then run "
            "bootseer report as root; docs/security.md, 'Who reads the store on S3')",
        )
    if public:
        return ok(name, "public: Slurm shows every user's jobs to everyone too")
    return ok(name, "private to root ([store] public_phases = false)")


@needs_config("clock")
def check_clock(node: Node) -> Check:
    """This node's clock against the store's (the time it stamps a new object with)."""
    name = "clock"
    try:
        store = node.store
    except BootseerError:
        return skip(name, "no store to compare with")
    key = f".tmp-doctor-{uuid.uuid4().hex}"
    try:
        before = time.time()
        store.write_bytes(key, b"", atomic=False)
        info = store.info(key)
        after = time.time()
    except (BootseerError, OSError) as exc:
        return skip(name, f"cannot stamp an object in the store ({type(exc).__name__})")
    finally:
        with contextlib.suppress(BootseerError, OSError):
            store.delete(key)
    if info is None or not info.mtime:
        return skip(name, "the store gives no modification times")
    # S3 stamps whole seconds: allow for that and the round trip.
    skew = max(info.mtime - after, before - 1 - info.mtime, 0.0)
    if skew > CLOCK_SKEW:
        return problem(
            name,
            f"{skew:.0f}s apart from the store's clock",
            "run chrony or systemd-timesyncd against the site's time source",
        )
    return ok(name, f"within {CLOCK_SKEW:g}s of the store's")


def _not_root_only(name: str, path: Path, st: os.stat_result, more_fix: str) -> Check | None:
    """The problem of a file that must be root's alone (site key, store secrets), or None."""
    if root_only(st):
        return None
    kind = "" if stat.S_ISREG(st.st_mode) else "not a regular file, "
    mode = stat.S_IMODE(st.st_mode)
    return problem(
        name,
        f"{path}: {kind}uid {st.st_uid}, mode {mode:04o}: must be root's alone",
        f"chown root {path}; chmod 0600 {path}{more_fix}",
    )


@needs_config("site key")
def check_site_key(node: Node) -> Check:
    """``[site] key_file``: a regular file, root's, mode 0600, holding a key."""
    name = "site key"
    assert node.cfg is not None
    path = node.cfg.site.key_file
    make = f"umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > {path}"
    try:
        st = os.lstat(path)
    except OSError as exc:
        return problem(name, f"{path}: {exc.strerror}: no p2p, nothing sealed", make)
    if (bad := _not_root_only(name, path, st, "")) is not None:
        return bad
    if os.geteuid() != 0:
        return ok(name, f"{path} (0600 root; contents need root to read)")
    from bootseer.sitekey import read_key_file

    try:
        keys = read_key_file(path)
    except ConfigError as exc:
        return problem(name, str(exc), make)
    return ok(name, f"{path} (0600 root, {len(keys)} key{'s' if len(keys) > 1 else ''})")


@needs_config("store secrets")
def check_store_secrets(node: Node) -> Check:
    """``[store] secrets_file``: absent (anonymous access) or root's alone (0600)."""
    name = "store secrets"
    assert node.cfg is not None
    path = node.cfg.store.secrets_file
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ok(name, f"{path} absent: the store is opened anonymously")
    except OSError as exc:
        return problem(name, f"{path}: {exc.strerror}", f"ls -l {path}")
    rotate = "; rotate the keys others could read"
    if (bad := _not_root_only(name, path, st, rotate)) is not None:
        return bad
    if os.geteuid() != 0:
        return ok(name, f"{path} (0600 root; contents need root to read)")
    from bootseer.credentials import read_secrets_file

    try:
        creds = read_secrets_file(path)
    except ConfigError as exc:
        return problem(name, str(exc), f"fix {path} (docs/security.md, Store secrets)")
    return ok(name, f"{path} (0600 root, {'anonymous' if creds.anonymous else 'keys set'})")


@needs_config("metrics")
def check_metrics(node: Node) -> Check:
    """``[metrics] textfile_dir``: root's, others cannot plant files node_exporter would
    export, and the agent's file there is fresh (written every ``interval``)."""
    name = "metrics"
    assert node.cfg is not None
    d = node.cfg.metrics.textfile_dir
    if d is None:
        return skip(name, "[metrics] textfile_dir unset: no Prometheus textfiles (docs/admin.md)")
    make = f"mkdir -p {d}; chown root {d}; chmod 0755 {d}"
    try:
        st = os.stat(d)
    except OSError as exc:
        return problem(name, f"{d}: {exc.strerror}: the agent and hooks write no metrics", make)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != 0 or mode & 0o022:
        return problem(
            name,
            f"{d}: uid {st.st_uid}, mode {mode:04o}: others may plant series node_exporter exports",
            make,
        )
    from bootseer.agent.metrics import FILE

    agent_file = d / FILE
    try:
        age = time.time() - os.stat(agent_file).st_mtime
    except OSError as exc:
        return problem(
            name,
            f"{agent_file}: {exc.strerror}: the agent has written no metrics",
            "restart bootseer-agent with this config (see the agent check)",
        )
    if age > 3 * node.cfg.metrics.interval + 5:
        return problem(
            name,
            f"{agent_file}: written {age:.0f} s ago, every {node.cfg.metrics.interval:g} s "
            "expected: the agent has stopped writing",
            "restart bootseer-agent; see its log",
        )
    return ok(name, f"{d} (the agent's file {age:.0f} s old)")


def check_python(node: Node) -> Check:
    """The interpreter is one bootseer runs on, with an extraction filter for deps restores
    (tarfile's own from 3.11.4, bootseer's copy of its rules before: Debian's 3.11.2)."""
    name = "python"
    version = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info[:2] < PYTHON_MIN:
        return problem(
            name,
            f"{node.python} is {version}: bootseer needs Python >= 3.11",
            "rebuild the venv on Python >= 3.11 (BOOTSEER_PY=... scripts/bootstrap)",
        )
    which = "tarfile's data filter" if hasattr(tarfile, "data_filter") else "bootseer's data filter"
    return ok(name, f"{version} with {which}: {node.python}")


def check_path(node: Node) -> Check:
    """Job users can run ``bootseer``: on their PATH, or the venv's executable by them."""
    name = "PATH"
    found = shutil.which("bootseer", path=node.user_path)
    if found is not None:
        blocked = others_cannot_run(Path(found))
        if blocked is None:
            return ok(name, f"{found}")
        return problem(name, f"{blocked}: not executable by others", f"chmod o+rx {blocked}")
    venv = node.python.parent / "bootseer"
    link = f"ln -s {venv} /usr/local/bin/"
    if not venv.exists():
        return problem(name, f"no bootseer on {node.user_path} nor at {venv}", link)
    blocked = others_cannot_run(venv) or others_cannot_run(Path(os.path.realpath(node.python)))
    if blocked is not None:
        return problem(name, f"{blocked}: not executable by others", f"chmod o+rx {blocked}")
    return ok(name, f"not on users' PATH, but they can run {venv}")


def others_cannot_run(path: Path) -> Path | None:
    """The first of ``path`` and its directories that others cannot pass or run, or None."""
    path = Path(os.path.abspath(path))
    for p in (*reversed(path.parents), path):
        try:
            mode = os.stat(p).st_mode
        except OSError:
            return p
        if not mode & stat.S_IXOTH or (p == path and not mode & stat.S_IROTH):
            return p
    return None


CHECKS: tuple[CheckFn, ...] = (
    check_config,
    check_plugstack,
    check_plugin,
    check_hooks,
    check_timeout,
    check_agent,
    check_stale_jobs,
    check_fuse,
    check_store,
    check_store_exposure,
    check_phase_privacy,
    check_clock,
    check_site_key,
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
            out.append(problem(fn.__name__.removeprefix("check_"), str(exc), "see the error"))
    return out


def store_check(cfg: SiteConfig, config_path: Path) -> Check:
    """The store alone (``bootseer config --check``)."""
    return check_store(Node("", SLURM_CONF, config_path, cfg))


def report(node: Node, checks: list[Check]) -> dict[str, Any]:
    """``--json``'s document."""
    return {
        "node": node.name,
        "ok": all(c.ok for c in checks),
        "checks": [c.to_json() for c in checks],
    }


# -- many nodes ------------------------------------------------------------------------

RSH = "ssh -o BatchMode=yes -o ConnectTimeout=10"


@dataclass(frozen=True)
class NodeAnswer:
    """One node's checks from ``bootseer doctor --json`` run there, or why there are none."""

    node: str
    checks: tuple[Check, ...] = ()
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and all(c.ok for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"ok": self.ok, "checks": [c.to_json() for c in self.checks]}
        if self.error:
            doc["error"] = self.error
        return doc


def ask_node(node: str, rsh: str, bootseer: str, timeout: float = 120.0) -> NodeAnswer:
    """Run ``bootseer doctor --json`` on ``node`` through ``rsh`` (ssh's way: the node,
    then one command line for its shell)."""
    import json
    import shlex
    import subprocess

    remote = shlex.join([bootseer, "doctor", "--json", "--node", node])
    try:
        r = subprocess.run(
            [*shlex.split(rsh), node, remote],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return NodeAnswer(node, error=f"no answer within {timeout:g}s")
    except OSError as exc:
        return NodeAnswer(node, error=f"{rsh.split()[0]}: {exc.strerror}")
    try:
        doc = json.loads(r.stdout)
        checks = tuple(
            Check(str(c["name"]), str(c["status"]), str(c["detail"]), str(c.get("fix", "")))
            for c in doc["checks"]
        )
    except (ValueError, KeyError, TypeError):
        said = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
        return NodeAnswer(node, error=said)
    return NodeAnswer(node, checks)


def ask_nodes(
    nodes: list[str], rsh: str = RSH, bootseer: str = "bootseer", fanout: int = 32
) -> list[NodeAnswer]:
    """Every node's answer, ``fanout`` at a time, in the order of ``nodes``."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(fanout, len(nodes)))) as pool:
        return list(pool.map(lambda n: ask_node(n, rsh, bootseer), nodes))
