"""The files one node gets: each with its bytes and its mode (all owned by root).

Rendered here, from the bundle, the layout and the site's files on the admin machine:
the hook wrappers (Slurm hands a Prolog no PATH: they name this install's config and
venv), the SPANK plugin, the docs, the agent's systemd unit, the site config (mode
0644: users read it) and the two root-only files it names, the store's secrets and the
site key (0600).

    >>> hook_wrapper(Layout(), "prolog").decode().splitlines()[-1]
    'exec /opt/bootseer/share/bootseer/prolog/bootseer-prolog'
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from bootseer.config import SiteConfig
from bootseer.errors import ConfigError
from bootseer.install.bundle import Bundle
from bootseer.install.layout import Layout, Role
from bootseer.stepapi import HOOKS, Hook


@dataclass(frozen=True)
class NodeFile:
    path: Path
    data: bytes
    mode: int

    def __repr__(self) -> str:
        return f"NodeFile({self.path}, {len(self.data)} bytes, {self.mode:04o})"


@dataclass(frozen=True)
class SiteFiles:
    """The site's config and root-only files, read on the admin machine."""

    config: bytes
    secrets: bytes | None  # None: no secrets file (anonymous store, or file://)
    site_key: bytes

    @classmethod
    def read(cls, config_path: Path) -> SiteFiles:
        try:
            raw = config_path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"site config {config_path}: {exc.strerror}") from None
        cfg = parse(raw, config_path)
        try:
            key = cfg.site.key_file.read_bytes()
        except FileNotFoundError:
            raise ConfigError(
                f"no site key at {cfg.site.key_file} ([site] key_file of {config_path}): make "
                f"one (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > "
                f"{cfg.site.key_file}) and install again: every node gets the same"
            ) from None
        except OSError as exc:
            raise ConfigError(
                f"site key {cfg.site.key_file}: {exc.strerror} (run as root)"
            ) from None
        try:
            secrets: bytes | None = cfg.store.secrets_file.read_bytes()
        except FileNotFoundError:
            secrets = None
        except OSError as exc:
            raise ConfigError(
                f"store secrets {cfg.store.secrets_file}: {exc.strerror} (run as root)"
            ) from None
        return cls(raw, secrets, key)


def parse(raw: bytes, where: Path) -> SiteConfig:
    try:
        return SiteConfig.from_mapping(tomllib.loads(raw.decode()), source=where)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: not valid TOML: {exc}") from None
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


# node_exporter's textfile collector directory in Debian's prometheus-node-exporter
# (its /etc/default/prometheus-node-exporter): where an install points [metrics].
DEFAULT_TEXTFILE_DIR = Path("/var/lib/prometheus/node-exporter")


def with_textfile_dir(raw: bytes, where: Path, textfile_dir: Path | None) -> bytes:
    """The site config as the nodes get it: ``[metrics] textfile_dir`` set to
    ``textfile_dir`` where the config leaves it unset (a line after its ``[metrics]``
    header, or a ``[metrics]`` table at the end); a config that sets it keeps its own.
    ``textfile_dir`` None: the config as it is.

    >>> raw = with_textfile_dir(b"[hooks]\\nstrict = false\\n", Path("c.toml"), Path("/m"))
    >>> parse(raw, Path("c.toml")).metrics.textfile_dir
    PosixPath('/m')
    """
    import re

    cfg = parse(raw, where)
    if textfile_dir is None or cfg.metrics.textfile_dir is not None:
        return raw
    line = f"textfile_dir = {_toml_string(str(textfile_dir))}  # bootseer install --metrics-dir\n"
    text = raw.decode()
    header = re.search(r"^[ \t]*\[[ \t]*metrics[ \t]*\][ \t]*(#.*)?(\n|$)", text, re.M)
    if header is not None:
        cut = header.end()
        new = text[:cut] + ("" if text[:cut].endswith("\n") else "\n") + line + text[cut:]
    else:
        new = text + ("" if text.endswith("\n") or not text else "\n") + "\n[metrics]\n" + line
    out = new.encode()
    try:
        done = parse(out, where).metrics.textfile_dir
    except ConfigError:
        done = None
    if done != textfile_dir:
        raise ConfigError(
            f'{where}: cannot add [metrics] textfile_dir = "{textfile_dir}" to it (its '
            "[metrics] is not a table of its own): set it there, or --metrics-dir none"
        )
    return out


def _toml_string(text: str) -> str:
    import json

    return json.dumps(text)  # a TOML basic string is JSON's, for a path


def hook_wrapper(layout: Layout, hook: Hook) -> bytes:
    return (
        "#!/bin/sh\n"
        f"# bootseer install: slurm.conf's {hook.capitalize()}= (Slurm hands a hook no PATH).\n"
        f"export BOOTSEER_CONFIG={layout.config}\n"
        f"export BOOTSEER_PYTHON={layout.python}\n"
        f"exec {layout.hook_script(hook)}\n"
    ).encode()


# The agent's capabilities, and why each (the unit's CapabilityBoundingSet=; every other
# capability goes: docs/admin.md, "The agent's unit").
AGENT_CAPABILITIES = (
    "CAP_SYS_ADMIN",  # mount and unmount its FUSE mount (and a job's stale checkpoint mount)
    "CAP_DAC_OVERRIDE",  # root's own files under any mode; what epilogs left of users' jobs,
    "CAP_FOWNER",  # swept (their files in sticky run dirs)
    "CAP_CHOWN",  # a job's files made for its user
    "CAP_SETUID",  # a user's image file is opened by a child that became the user
    "CAP_SETGID",
    "CAP_KILL",  # that child, and a stale job's checkpoint daemon (the user's)
    "CAP_NET_BIND_SERVICE",  # peers' port 746
    "CAP_SYS_NICE",  # fetch threads back from the background's nice 19
)

# What systemd may not do to this unit: make a mount namespace of its own. The agent's
# FUSE mount must be seen by every job on the node, and a mount made in a namespace of
# the service's never is (ProtectSystem=, PrivateTmp= and the like: docs/admin.md).
NO_MOUNT_NAMESPACE = (
    "PrivateTmp",
    "PrivateDevices",
    "PrivateMounts",
    "PrivateIPC",
    "PrivateNetwork",
    "ProtectSystem",
    "ProtectHome",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectControlGroups",
    "ProtectProc",
    "ProcSubset",
    "ReadOnlyPaths",
    "ReadWritePaths",
    "InaccessiblePaths",
    "TemporaryFileSystem",
    "BindPaths",
    "BindReadOnlyPaths",
    "RootDirectory",
    "RootImage",
    "MountAPIVFS",
)


def agent_unit(layout: Layout) -> bytes:
    """The agent's systemd unit: ready (Type=notify) once its socket and mount are up,
    before slurmd starts; its Documentation= is the docs this install puts on the node.
    ``systemctl reload`` is the restart in place (it waits for the jobs that use the
    agent: :mod:`bootseer.agent.handover`); the rest is the hardening a root daemon whose
    FUSE mount every job sees allows (no mount namespace: :data:`NO_MOUNT_NAMESPACE`)."""
    return (
        "# bootseer node agent: lazy container images over FUSE, block cache, traces, prefetch.\n"
        "# Written by bootseer install; slurmd waits for it (Before=), and the agent tells\n"
        "# systemd when its socket and FUSE mount are up (Type=notify).\n"
        "# Upgrades and config changes: systemctl reload bootseer-agent (the restart in\n"
        "# place, once no job uses the agent); a restart or stop takes running jobs' images.\n"
        '# Hardening: docs/admin.md, "The agent\'s unit" (no mount namespace: jobs must see\n'
        "# the agent's FUSE mount).\n"
        "[Unit]\n"
        "Description=bootseer node agent (lazy container images)\n"
        f"Documentation=file://{layout.docs}/image.md file://{layout.docs}/admin.md "
        f"file://{layout.docs}/doctor.md\n"
        "After=network-online.target remote-fs.target munge.service\n"
        "Wants=network-online.target\n"
        "Before=slurmd.service\n\n"
        "[Service]\n"
        "Type=notify\n"
        "NotifyAccess=main\n"
        f"Environment=BOOTSEER_CONFIG={layout.config}\n"
        f"ExecStart={layout.bootseer} agent\n"
        f"ExecReload={layout.bootseer} agent --restart --force\n"
        "KillSignal=SIGTERM\n"
        "TimeoutStartSec=180\n"
        "TimeoutStopSec=30\n"
        "Restart=on-failure\n"
        "RestartSec=2\n"
        "User=root\n"
        "LimitNOFILE=65536\n"
        "Nice=-5\n"
        "IOSchedulingClass=best-effort\n"
        "IOSchedulingPriority=2\n"
        "StandardOutput=journal\n"
        "StandardError=journal\n"
        "SyslogIdentifier=bootseer-agent\n"
        f"CapabilityBoundingSet={' '.join(AGENT_CAPABILITIES)}\n"
        "AmbientCapabilities=\n"
        "NoNewPrivileges=yes\n"
        "SystemCallFilter=@system-service @mount\n"
        "SystemCallErrorNumber=EPERM\n"
        "SystemCallArchitectures=native\n"
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6\n"
        "RestrictNamespaces=yes\n"
        "RestrictRealtime=yes\n"
        "RestrictSUIDSGID=yes\n"
        "LockPersonality=yes\n"
        "ProtectClock=yes\n"
        "DevicePolicy=closed\n"
        "DeviceAllow=/dev/fuse rw\n\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    ).encode()


def version_files(layout: Layout, bundle: Bundle, role: Role = "compute") -> list[NodeFile]:
    """The files of this version (``layout`` resolved for its node) that a host of
    ``role`` gets, the wheels and venv aside: the plugin, the hooks and their wrappers,
    the docs, the agent's unit (a client: the plugin and docs alone). The same on every
    node of a site, and what the Debian package holds (install.debpkg)."""
    top = bundle.top
    files = [NodeFile(layout.plugin, bundle.plugin.read_bytes(), 0o755)]
    compute = role == "compute"
    for hook in HOOKS if compute else ():
        script = (top / hook / f"bootseer-{hook}").read_bytes()
        files.append(NodeFile(layout.hook_script(hook), script, 0o755))
        files.append(NodeFile(layout.hook(hook), hook_wrapper(layout, hook), 0o755))
    for doc in sorted((top / "docs").glob("*.md")):
        files.append(NodeFile(layout.docs / doc.name, doc.read_bytes(), 0o644))
    if layout.unit is not None and compute:
        files.append(NodeFile(layout.unit, agent_unit(layout), 0o644))
    return files


def site_files(layout: Layout, site: SiteFiles, role: Role = "compute") -> list[NodeFile]:
    """The site's files a host of ``role`` gets: the config (0644: users read it) and,
    for a compute node, the root-only files it names, the site key and the secrets."""
    # The config as the node reads it: a secrets file it does not name lies next to it.
    cfg = parse(site.config, layout.config)
    files = [NodeFile(layout.config, site.config, 0o644)]
    if role != "compute":
        return files  # the root-only files serve the root-run parts a client has none of
    files.append(NodeFile(cfg.site.key_file, site.site_key, 0o600))
    if site.secrets is not None:
        files.append(NodeFile(cfg.store.secrets_file, site.secrets, 0o600))
    return files


def node_files(
    layout: Layout, bundle: Bundle, site: SiteFiles, role: Role = "compute"
) -> list[NodeFile]:
    """Every file of ``layout`` (already resolved for its node) but the wheels and venv
    that a host of ``role`` gets (a client: the plugin, docs and config alone)."""
    return version_files(layout, bundle, role) + site_files(layout, site, role)
