"""The site config: one TOML file an admin owns.

Its path is ``$BOOTSEER_CONFIG`` or ``/etc/bootseer/config.toml``. A missing file
means the defaults; a bad one raises :class:`ConfigError` naming the key::

    >>> cfg = SiteConfig.from_mapping({"store": {"uri": "file:///shared/bootseer"}})
    >>> cfg.store.uri
    'file:///shared/bootseer'

Every section is a frozen dataclass below; its fields and defaults are the
reference for the file (the README lists them too).
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bootseer.errors import ConfigError, NoSiteConfig
from bootseer.options import SCOPES

if TYPE_CHECKING:
    from bootseer.store import Store

DEFAULT_PATH = Path("/etc/bootseer/config.toml")
ENV_VAR = "BOOTSEER_CONFIG"

# Keys this version no longer has, and why; a config that still sets one is read as if
# it did not (an upgrade must not break a node's hooks over a setting that went away).
RETIRED: dict[str, str] = {
    # A separate 20 s bound for the mount failed every node of a loaded 16-node job
    # (27-30 s to come up); the ckpt step's own deadline bounds it now.
    "ckpt.mount_timeout": "the prolog waits for the mount within the ckpt step's "
    "deadline ([hooks] step_deadlines.ckpt, else prolog_deadline)",
}


@dataclass(frozen=True)
class SiteSection:
    """The site key (``bootseer.sitekey``): root-only (0600) and the same on every node.

    One key per line, the current one first; root-run parts seal what they write to the
    store with it and refuse what does not verify (docs/security.md). ``[p2p]`` derives
    its peer tokens from the same file unless it names its own (and a config with only
    ``[p2p] key_file``, from before this section, names the site's key with it)."""

    key_file: Path = Path("/etc/bootseer/site.key")


@dataclass(frozen=True)
class StoreSection:
    # file:///shared/bootseer or s3://bucket/prefix?endpoint_override=host:port&scheme=http
    uri: str = "file:///var/lib/bootseer/store"
    # S3 credentials live here, root-only (0600), never in this file, which users read
    # (bootseer.credentials). Unset: secrets.toml next to the site config.
    secrets_file: Path = Path("/etc/bootseer/secrets.toml")
    # Phase records readable by every user (`bootseer report` as anyone: they hold what
    # squeue shows every user). false on a site with Slurm's PrivateData=jobs: a file://
    # store writes them root's alone too, S3 gets no anonymous access, report runs as root.
    public_phases: bool = True

    def open(self, create: bool = True, look: bool = True) -> Store:
        """The store this section names (pyarrow is imported here, on first use): with the
        secrets file's credentials when run as root, anonymous otherwise. ``create=False``
        only looks (``open_store``); ``look=False`` too does not (an S3 store opened
        without a request)."""
        return self.open_uri(self.uri, create, look)

    def open_uri(self, uri: str, create: bool = True, look: bool = True) -> Store:
        """Another store (a checkpoint target) with the same credentials as :meth:`open`."""
        from bootseer.credentials import store_credentials
        from bootseer.store import PUBLIC_TOP, open_store

        creds = store_credentials(self.secrets_file)
        public = PUBLIC_TOP if self.public_phases else frozenset()
        # A file:// root is never made here: a missing one is an unmounted shared
        # filesystem (store/_store.py, missing_root).
        return open_store(
            uri, creds.access_key, creds.secret_key, create, public, make_root=False, look=look
        )


@dataclass(frozen=True)
class PathsSection:
    """The roots of node-local paths; :mod:`bootseer.nodepaths` lays out what is under
    them. ``%n`` stands for the node name, as in slurm.conf, so several slurmd on one
    machine (slurm-dev) keep apart."""

    run_dir: Path = Path("/run/bootseer")  # per-job state on the node; read by the SPANK plugin
    cache_dir: Path = Path("/var/cache/bootseer")  # node-local caches (blocks, snapshots)
    log_dir: Path = Path("/var/log/bootseer")  # one log per node, lines tagged with the job id


@dataclass(frozen=True)
class HooksSection:
    strict: bool = False  # a failed step fails the prolog (Slurm then drains the node)
    # Seconds for everything a hook does: its steps, then its phase records (records_reserve).
    prolog_deadline: float = 90.0
    epilog_deadline: float = 90.0
    # Per-step deadlines in seconds; a step without an entry gets the hook's deadline.
    step_deadlines: dict[str, float] = field(default_factory=dict)
    # Fault injection for tests and drills: "STEP:raise" or "STEP:hang".
    failpoints: list[str] = field(default_factory=list)
    # The node agent cleans up what hooks left of jobs Slurm no longer runs on the node
    # (an epilog killed or never run: agent/sweep.py), asking Slurm (one squeue) at most
    # once in this many seconds, and only while some job's state is on the node. 0: never.
    sweep_interval: float = 600.0

    def __post_init__(self) -> None:
        if 0 < self.sweep_interval < 1:
            raise ConfigError(
                f"hooks.sweep_interval must be 0 (off) or at least 1 second, "
                f"not {self.sweep_interval}"
            )


@dataclass(frozen=True)
class PhasesSection:
    """Phase records (``bootseer report``)."""

    enabled: bool = True
    # The prolog's rows reach the store from a detached process, off the job's start path;
    # false writes them before the prolog returns.
    background_flush: bool = True
    # The first node asks Slurm for the job's submit time (off the start path), so the
    # report tells queue wait from startup.
    submit_time: bool = True
    squeue: Path = Path("/usr/bin/squeue")
    squeue_timeout: float = 3.0
    max_marks_bytes: int = 1 << 20  # per job and node; marks beyond are dropped with a note


# A user's checkpoints: 1 TiB unless the site says more (the door and the mount write as
# root, past any filesystem quota of hers: a default that fits most sites' targets).
DEFAULT_CKPT_QUOTA = {"user": 1 << 40, "account": 0}
DOOR_MODES = ("off", "job", "any")


@dataclass(frozen=True)
class CkptSection:
    """Striped checkpoint storage (``bootseer.ckpt``, ``--bootseer-ckpt``)."""

    # K store URIs; stripe unit i of a file goes to targets[i % K]. The first also holds
    # the manifests, so keep it first when adding targets.
    targets: list[str] = field(default_factory=list)
    unit_size: int = 8 << 20  # bytes per stripe unit
    read_ahead: int = 16  # the most units a sequential reader fetches ahead (memory: as many)
    max_inflight: int = 8  # store requests in flight per open file, reading or writing
    # A job's mount daemon has the node agent fetch the namespace's units (the files
    # committed last first) once the image's hot set is local, a few at a time, up to
    # this many MiB, so that the store link's idle time in the prolog and the container's
    # start goes to the checkpoint (bootseer.ckpt.warm); 0: off.
    warm_mib: int = 4096
    verify: bool = True  # check each unit's checksum on read
    # Where jobs' mounts go (``%n`` = node); unset or empty: ``<paths.run_dir>/ckpt``.
    mount_root: Path | None = None
    # (The prolog waits for the mount within the ckpt step's deadline: ``mount_timeout``
    # is retired, see RETIRED.)
    # The kernel's read-ahead on a mount (KiB); it also bounds each FUSE read request.
    kernel_read_ahead_kb: int = 4096
    # Node-local space for the parts of a file written out of order (a gap, a rewrite
    # behind the stream), shared by the node's mounts: root's, mode 0700; unset:
    # <paths.cache_dir>/ckpt-stage.
    stage_dir: Path | None = None
    stage_bytes: int = 4 << 30  # bound per node (all mounts); past it a write fails ENOSPC
    # Stored bytes on the targets that one user's checkpoints may hold ("user"), and all
    # the users of one Slurm account together ("account", only where Slurm checks a
    # job's account against its user); 0: no quota. A write through the mount or the
    # door that would pass it fails with EDQUOT (bootseer.ckpt.quota, docs/ckpt.md).
    # A kind the site's table leaves out keeps its default.
    quota: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_CKPT_QUOTA))
    # Seconds a writer trusts its last count of the store (other nodes' writes show up
    # at the next count; a write that would pass the quota always counts again).
    quota_rescan: float = 10.0
    # Lists the users of each account (for the "account" quota).
    sacctmgr: Path = Path("/usr/bin/sacctmgr")
    # Who may use the checkpoint door (a user's `bootseer ckpt` through the node agent):
    # "job": a user with a job on the node (Slurm's squeue says, [phases] squeue), "any":
    # every user who can reach the agent's socket, "off": nobody (root's CLI still works).
    door: str = "job"

    def __post_init__(self) -> None:
        if self.warm_mib < 0:
            raise ConfigError(f"ckpt.warm_mib must be 0 (off) or more, not {self.warm_mib}")
        if self.door not in DOOR_MODES:
            raise ConfigError(
                f"ckpt.door must be one of {', '.join(DOOR_MODES)}, not {self.door!r}"
            )
        for kind in self.quota:
            if kind not in DEFAULT_CKPT_QUOTA:
                raise ConfigError(f"ckpt.quota.{kind}: not one of user, account")
        object.__setattr__(self, "quota", {**DEFAULT_CKPT_QUOTA, **self.quota})


@dataclass(frozen=True)
class ImageSection:
    """The node agent: lazy images over FUSE, block cache, traces, prefetch (docs/image.md)."""

    # Unset: derived from [paths] by bootseer.nodepaths (in brackets).
    socket: Path | None = None  # the hooks talk to the agent here (<run_dir>/agent.sock)
    mount_dir: Path | None = None  # FUSE mount: one <job_id>.sqsh per job (<run_dir>/images)
    cache_dir: Path | None = None  # verified blocks; survives restarts (<cache_dir>/image)
    cache_size_gib: float = 100.0  # size cap; LRU eviction of blocks no running job uses first
    # For `bootseer image add` and first-use registration; 256 KiB measured best behind a
    # 100 Mbit/s store link, 1024 behind 10 Gbit/s at real sizes (docs/image.md).
    block_size_kib: int = 256
    prefetch_parallel: int = 16  # parallel block reads from the store
    background_parallel: int = 2  # of those, at most this many fill the cold rest
    hot_deadline: float = 60.0  # seconds the prolog waits for the hot set to be local
    # The prolog returns once this leading part of the hot set is local; the rest streams on
    # ahead of the job's reads (1.0: wait for all of it). 0.25 measured fastest.
    hot_start_fraction: float = 0.25
    # The blocks a node gets from one peer (the hot set's, the fill's) are asked of it in
    # runs of up to this many KiB, one request each (0: block by block). docs/image.md.
    prefetch_run_kib: int = 8192
    # A trace's hot blocks are also stored in trace order as bundles of this many KiB, so a
    # cold node reads its hot set in a few large requests, not one per block (0: no
    # bundles; docs/image.md, "Bundles"). At most bundle_max_gib of each trace is bundled.
    bundle_kib: int = 4096
    bundle_max_gib: float = 8.0
    trace_window: float = 300.0  # seconds after the prolog that count as startup
    fetch_timeout: float = 30.0  # a read the store cannot serve by then fails with EIO
    register_wait: float = 60.0  # how long a node waits for another to register a path image
    # The largest path image the agent registers: a larger file is refused by its size,
    # before a byte of it is hashed (a sparse file of any size costs a user nothing; its
    # hashing and digests cost the node's CPU and memory). Also capped by the blocks one
    # manifest may hold (image.manifest.MAX_BLOCKS).
    max_image_gib: float = 256.0
    # The background fill (the image's cold rest) starts at the job's first step, or this
    # many seconds after the prolog if no first step is marked, and never exceeds
    # fill_mbit (0: no cap) on the node's link, so it never competes with startup.
    fill_delay: float = 300.0
    fill_mbit: float = 0.0
    # The socket is open to every user and each connection holds a thread until it is
    # answered (or 10 s idle): users' connections at once, all together and per user.
    # Root's (the prolog, the epilog) are never refused.
    max_connections: int = 64
    max_connections_per_user: int = 8
    # A path image's trace owner is its file's owner, and root runs no jobs: a root-owned
    # image's jobs each start from their own user's trace. This user's trace (a team's
    # warm-up account) leads instead, for root-owned path images only ("": nobody's).
    root_path_trace_owner: str = ""

    def __post_init__(self) -> None:
        if self.root_path_trace_owner:
            from bootseer.users import check_user

            try:
                check_user(self.root_path_trace_owner)
            except ValueError as exc:
                raise ConfigError(f"image.root_path_trace_owner: {exc}") from None
        if not 0 <= self.prefetch_run_kib <= 65536:
            raise ConfigError(
                f"image.prefetch_run_kib must be 0 to 65536, not {self.prefetch_run_kib}"
            )
        if not 0 <= self.bundle_kib <= 65536:
            raise ConfigError(f"image.bundle_kib must be 0 to 65536, not {self.bundle_kib}")
        if self.bundle_max_gib < 0:
            raise ConfigError(
                f"image.bundle_max_gib must be 0 or more, not {self.bundle_max_gib:g}"
            )
        if not 1 <= self.max_connections_per_user <= self.max_connections:
            raise ConfigError(
                "image.max_connections_per_user must be at least 1 and at most "
                f"image.max_connections ({self.max_connections}), "
                f"not {self.max_connections_per_user}"
            )


@dataclass(frozen=True)
class P2PSection:
    """Peer-to-peer among a job's nodes: each piece leaves the store once per job (docs/p2p.md)."""

    enabled: bool = True
    # TCP port every node's agent serves its jobs' pieces on; below 1024, so that no user
    # can listen on it while an agent is down and relay its peers' requests.
    port: int = 746
    # Root-only (0600) and the same on every node: peers prove they belong to a job with
    # a token derived from it. Without it, every node fetches from the store itself.
    # Unset: [site] key_file.
    key_file: Path = Path("/etc/bootseer/site.key")
    # Node name -> address, /etc/hosts format; unset: the system's resolver.
    hosts_file: Path | None = None
    # The longest a piece from a peer may take (an owner waiting on the store says so every
    # second), then the store. An owner whose prolog has not reached the job yet waits
    # for it two thirds of this, heartbeating (a late prolog is not a dead peer).
    peer_timeout: float = 30.0
    # A peer that says nothing at all this long (no connection, hello, heartbeat or byte)
    # is dead or hung: dropped. Busy is not dead: keep it well above the longest pause a
    # loaded node makes (docs/p2p.md has the figures).
    peer_silence: float = 10.0
    dead_for: float = 30.0  # a peer that failed is skipped this long
    max_connections: int = 64  # peer connections an agent serves at once, and keeps open


DEFAULT_DEPS_QUOTA = {"user": 256 << 30, "account": 2 << 40, "cluster": 2 << 40}


@dataclass(frozen=True)
class DepsSection:
    """Dependency snapshots (``--bootseer-deps``, ``bootseer deps``); see docs/deps.md."""

    # Scopes jobs may share snapshots in; "user" is always allowed. Add "account"
    # and/or "cluster" to let members of an account (or everyone) reuse each other's.
    scopes: list[str] = field(default_factory=lambda: ["user"])
    # Absolute symlink targets a snapshot may hold (a venv's bin/python points at its
    # interpreter); every other link must stay inside the prefix.
    link_roots: list[str] = field(default_factory=lambda: ["/usr", "/opt"])
    # The interpreter whose version and ABI go into the snapshot key.
    python: str = "/usr/bin/python3"
    max_bytes: int = 64 << 30  # largest snapshot (uncompressed) captured or restored
    max_files: int = 1_000_000  # most entries (files, dirs, links) in one snapshot
    max_key_file_bytes: int = 16 << 20  # largest key file hashed
    frame_bytes: int = 8 << 20  # uncompressed bytes per independent zstd frame
    # Largest frame a restore decodes (each is held in memory whole): a manifest that
    # declares more is refused before any frame is fetched. At least frame_bytes.
    max_frame_bytes: int = 64 << 20
    level: int = 3  # zstd level for captures
    threads: int = 0  # decode/encode threads; 0: one per core, at most 8
    # Asked whether Slurm checks a job's account against its user (scope=account is
    # used only if it does: docs/security.md, "Snapshot scopes").
    scontrol: Path = Path("/usr/bin/scontrol")
    # Stored bytes of snapshots one scope of each kind may hold in the store (0: no
    # quota); an epilog capture that would pass it is skipped, nothing written.
    # A kind the site's table leaves out keeps its default.
    quota: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_DEPS_QUOTA))

    def __post_init__(self) -> None:
        for kind in self.quota:
            if kind not in DEFAULT_DEPS_QUOTA:
                raise ConfigError(f"deps.quota.{kind}: not one of user, account, cluster")
        object.__setattr__(self, "quota", {**DEFAULT_DEPS_QUOTA, **self.quota})
        for scope in self.scopes:
            if scope not in SCOPES:
                raise ConfigError(f"deps.scopes: {scope!r} is not one of user, account, cluster")
        for root in self.link_roots:
            if not root.startswith("/") or ".." in root.split("/"):
                raise ConfigError(f"deps.link_roots: {root!r} is not an absolute path")
        if not 1 <= self.level <= 22:
            raise ConfigError(f"deps.level must be 1 to 22, not {self.level}")
        if self.frame_bytes < 64 << 10:
            raise ConfigError(f"deps.frame_bytes must be at least 65536, not {self.frame_bytes}")
        if self.max_frame_bytes < self.frame_bytes:
            raise ConfigError(
                f"deps.max_frame_bytes ({self.max_frame_bytes}) must be at least "
                f"deps.frame_bytes ({self.frame_bytes})"
            )


@dataclass(frozen=True)
class MetricsSection:
    """Prometheus metrics for node_exporter's textfile collector (``bootseer.metrics``,
    docs/admin.md): the agent and the hooks write ``bootseer_*.prom`` files there."""

    # node_exporter's --collector.textfile.directory (``%n``: the node); unset: no metrics.
    textfile_dir: Path | None = None
    interval: float = 30.0  # seconds between the agent's writes (and one at its exit)

    def __post_init__(self) -> None:
        if self.interval < 1:
            raise ConfigError(f"metrics.interval must be at least 1 second, not {self.interval}")


@dataclass(frozen=True)
class SiteConfig:
    site: SiteSection = field(default_factory=SiteSection)
    store: StoreSection = field(default_factory=StoreSection)
    paths: PathsSection = field(default_factory=PathsSection)
    hooks: HooksSection = field(default_factory=HooksSection)
    phases: PhasesSection = field(default_factory=PhasesSection)
    ckpt: CkptSection = field(default_factory=CkptSection)
    image: ImageSection = field(default_factory=ImageSection)
    deps: DepsSection = field(default_factory=DepsSection)
    p2p: P2PSection = field(default_factory=P2PSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)
    source: Path | None = None  # the file it came from, for messages
    # for_node's input, with ``%n`` still in its paths (None: this one is not node-resolved).
    template: SiteConfig | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: Path | None = None) -> SiteConfig:
        store = data.get("store")
        if isinstance(store, Mapping):
            for secret in ("access_key", "secret_key"):
                if secret in store:
                    raise ConfigError(
                        f"store.{secret} does not belong in the site config, which every "
                        "user reads: put it in the root-only secrets file "
                        "([store] secrets_file, default secrets.toml next to this config; "
                        "docs/security.md)"
                    )
        cfg: SiteConfig = _build(cls, data, prefix="", skip={"source", "template"})
        if source is not None and not (isinstance(store, Mapping) and "secrets_file" in store):
            cfg = dataclasses.replace(
                cfg,
                store=dataclasses.replace(cfg.store, secrets_file=source.parent / "secrets.toml"),
            )
        # One key file for the site: [p2p] key_file defaults to [site] key_file, and a
        # config from before [site] existed (only [p2p] key_file) names the site's key.
        p2p, site = data.get("p2p"), data.get("site")
        p2p_set = isinstance(p2p, Mapping) and "key_file" in p2p
        site_set = isinstance(site, Mapping) and "key_file" in site
        if not p2p_set:
            cfg = dataclasses.replace(
                cfg, p2p=dataclasses.replace(cfg.p2p, key_file=cfg.site.key_file)
            )
        elif not site_set:
            cfg = dataclasses.replace(cfg, site=SiteSection(key_file=cfg.p2p.key_file))
        return dataclasses.replace(cfg, source=source)

    def for_node(self, node: str) -> SiteConfig:
        """This config with ``%n`` in every path of every section replaced by ``node``."""

        from bootseer.nodename import expand

        def section(sec: Any) -> Any:
            paths = {
                f.name: Path(expand(str(v), node))
                for f in dataclasses.fields(sec)
                if isinstance(v := getattr(sec, f.name), Path)
            }
            return dataclasses.replace(sec, **paths)

        return dataclasses.replace(
            self,
            template=self.template or self,
            **{
                f.name: section(getattr(self, f.name))
                for f in dataclasses.fields(self)
                if f.name != "template" and dataclasses.is_dataclass(getattr(self, f.name))
            },
        )

    def hook_deadline(self, hook: str) -> float:
        """Seconds for everything one hook does: its steps, then its phase records."""
        return self.hooks.prolog_deadline if hook == "prolog" else self.hooks.epilog_deadline

    def records_reserve(self, hook: str) -> float:
        """The end of the hook's deadline kept for writing its phase records: the steps
        end this long before it (10 s, or a fifth of a short deadline)."""
        return min(10.0, self.hook_deadline(hook) / 5)

    def deadline(self, hook: str, step: str) -> float:
        whole = self.hook_deadline(hook)
        return min(self.hooks.step_deadlines.get(step, whole), whole)


def config_path() -> Path:
    return Path(os.environ.get(ENV_VAR) or DEFAULT_PATH)


def load_config(path: Path | None = None) -> SiteConfig:
    """Read the site config; a missing file at the default path gives the defaults, one
    named (``path``, ``$BOOTSEER_CONFIG``) raises :class:`~bootseer.errors.NoSiteConfig`."""
    explicit = path is not None or bool(os.environ.get(ENV_VAR))
    path = path or config_path()
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        if explicit:
            raise NoSiteConfig(f"site config {path} does not exist (set by ${ENV_VAR})") from None
        return SiteConfig()
    except OSError as exc:
        raise ConfigError(f"cannot read site config {path}: {exc.strerror}") from None
    try:
        data = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    try:
        return SiteConfig.from_mapping(data, source=path)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _build(
    cls: type[Any], data: Mapping[str, Any], prefix: str, skip: set[str] | None = None
) -> Any:
    if skip is None:
        skip = set()
    if not isinstance(data, Mapping):
        raise ConfigError(f"[{prefix.rstrip('.')}] must be a table")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls) if f.name not in skip}
    data = {k: v for k, v in data.items() if prefix + str(k) not in RETIRED}
    unknown = sorted(set(data) - fields)
    if unknown:
        known = ", ".join(sorted(fields))
        raise ConfigError(f"unknown key {prefix}{unknown[0]!s} (known here: {known})")
    values = {name: _convert(hints[name], data[name], prefix + name) for name in data}
    return cls(**values)


def _convert(hint: Any, value: Any, key: str) -> Any:
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _build(hint, value, prefix=key + ".")
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value == "" and len(args) < len(typing.get_args(hint)):
            return None  # an optional path left empty: the default
        return _convert(args[0], value, key)
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{key} must be a list, not {type(value).__name__}")
        return [_convert(item, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        _, item = typing.get_args(hint)
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a table, not {type(value).__name__}")
        return {str(k): _convert(item, v, f"{key}.{k}") for k, v in value.items()}
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, not {value!r}")
        return value
    if hint in (int, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key} must be a number, not {value!r}")
        if hint is int and not isinstance(value, int):
            raise ConfigError(f"{key} must be a whole number, not {value!r}")
        if value < 0:
            raise ConfigError(f"{key} must not be negative, not {value!r}")
        return hint(value)
    if hint is Path:
        if not isinstance(value, str) or not value.startswith("/"):
            raise ConfigError(f"{key} must be an absolute path, not {value!r}")
        return Path(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, not {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported type {hint!r}")  # a bug in a section's declaration
