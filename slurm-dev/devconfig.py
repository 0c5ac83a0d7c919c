"""slurm-dev's configuration: the settings of one cluster and the files rendered from them.

Everything lives under one state directory (devcluster.py lists it); this module writes
its ``etc/`` (slurm.conf, plugstack.conf, the bootseer site config, the prolog/epilog
wrappers, the munge and site keys, the node hosts file) and the directories the daemons
expect. Rendering only: starting daemons is daemons.py's, the store host storehost.py's.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from network import Network

if TYPE_CHECKING:
    from bootseer.store import Store

TOP = Path(__file__).resolve().parent.parent
DEFAULT_STATE = Path(os.environ.get("BOOTSEER_DEV_STATE", "/var/tmp/bootseer-dev"))
DEFAULT_PORT_BASE = int(os.environ.get("BOOTSEER_DEV_PORT_BASE", "17800"))
VENV = Path(os.environ.get("BOOTSEER_VENV", "/opt/bootseer/venv"))
# Each node's own local directory, like a real node's local disk: the same path on every
# node, a different directory behind it (<state>/nodes/<node>/local, bound in the slurmd's
# mount namespace). Jobs put node-local things here, e.g. a --bootseer-deps prefix.
NODE_LOCAL = Path("/var/tmp/slurm-dev-local")
# With --install-over-ssh: each node's own root (<state>/nodes/<node>/root, bound here in
# the node's sshd, slurmd and agent), where `bootseer install` puts the node's install.
# The nodes share one filesystem; one path with a different directory behind it per node
# keeps slurm.conf's one Prolog= line and the venvs' absolute paths true on every node.
NODE_ROOT = Path("/var/tmp/slurm-dev-root")
INSTALL_PREFIX = NODE_ROOT / "opt" / "bootseer"
INSTALL_ETC = NODE_ROOT / "etc" / "bootseer"


@dataclass
class Settings:
    state_dir: str
    nodes: int = 4
    port_base: int = DEFAULT_PORT_BASE
    s3: bool = False
    store_mbit: int = 200
    store_delay_ms: int = 0
    cpus_per_node: int = 8
    node_mbit: int = 0  # 0: ten times store_mbit
    # The nodes get bootseer from `bootseer install` over SSH (an sshd per node, sshd.py)
    # into NODE_ROOT, as a real cluster's do, instead of running this checkout's venv.
    ssh_install: bool = False
    # Each node's NODE_LOCAL a journaled ext4 of this many GiB of its own (a sparse file
    # on a loop device), as a node's local disk is; 0: a directory of the state dir's
    # file system (this machine's: ext4 without a journal, daemons.mount_node_fs).
    node_fs_gib: int = 0

    @property
    def network(self) -> Network:
        return Network(
            self.port_base,
            tuple(self.node_names),
            self.node_mbit or 10 * self.store_mbit,
            self.store_mbit,
            self.store_delay_ms,
        )

    @property
    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    @property
    def netns(self) -> str:
        return self.network.store_netns

    @property
    def store_ips(self) -> tuple[str, str]:
        """(this machine, the store host) on the cluster's bridge."""
        return self.network.host_ip, self.network.store_ip

    @property
    def weed_ports(self) -> tuple[int, int, int, int]:
        """(master, volume, filer, s3). Unique per cluster: SeaweedFS keeps local sockets
        named by port in /tmp, shared by every network namespace on the machine."""
        base = 30000 + (self.port_base % 1000) * 10
        return base, base + 1, base + 2, base + 3

    @property
    def s3_port(self) -> int:
        return self.weed_ports[3]


class ClusterConfig:
    """The state directory of one cluster and the configuration files in it."""

    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.dir = Path(settings.state_dir)
        self.etc = self.dir / "etc"
        self.run = self.dir / "run"
        self.logs = self.dir / "log"
        self.conf = self.etc / "slurm.conf"
        self.site_config = self.etc / "bootseer.toml"
        # The store's credentials, root only, next to the site config (its default
        # [store] secrets_file); --s3 only: the file:// store needs none.
        self.secrets_file = self.etc / "secrets.toml"
        self.s3_identities = self.etc / "s3.json"  # SeaweedFS's -s3.config, from the above

    # -- environment --------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """What a shell needs to use the cluster (what ``slurm-dev/env`` prints)."""
        return {
            "SLURM_CONF": str(self.conf),
            "BOOTSEER_CONFIG": str(self.site_config),
            "BOOTSEER_DEV_STATE": str(self.dir),
            "PATH": f"{VENV / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        }

    def open_store(self) -> Store:
        """The cluster's store, as root-run parts open it (with the secrets file's
        credentials); a user's process opens it anonymously (read-only on S3)."""
        import sys

        sys.path.insert(0, str(TOP / "lib"))
        from bootseer.credentials import read_secrets_file
        from bootseer.store import open_store

        creds = read_secrets_file(self.secrets_file)
        return open_store(self.store_uri(), creds.access_key, creds.secret_key)

    def store_uri(self) -> str:
        if self.s.s3:
            host = self.s.store_ips[1]
            return f"s3://bootseer/store?endpoint_override={host}:{self.s.s3_port}&scheme=http"
        return f"file://{self.dir / 'store'}"

    # -- configuration --------------------------------------------------------------

    def write_config(self) -> None:
        for d in (
            self.etc,
            self.run,
            self.logs,
            self.dir / "spool",
            self.dir / "ctld",
            self.dir / "store",  # bootseer never makes a store's root: the site does
            *(self.dir / "ckpt" / f"t{i}" for i in (1, 2, 3)),  # the checkpoint targets'
            self.dir / "lib",
        ):
            d.mkdir(parents=True, exist_ok=True)
        for node in self.s.node_names:
            for sub in ("run", "cache", "log"):
                (self.dir / "nodes" / node / sub).mkdir(parents=True, exist_ok=True)
            # The node's NODE_LOCAL, open to every user like a node's /tmp.
            local = self.dir / "nodes" / node / "local"
            local.mkdir(parents=True, exist_ok=True)
            local.chmod(0o1777)
        key = self.etc / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        # The site key (root only): root-run parts seal the records they write to the store
        # with it (docs/security.md) and agents derive each job's peer token from it.
        site_key = self.etc / "site.key"
        if not site_key.exists():
            fd = os.open(site_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, os.urandom(32).hex().encode() + b"\n")
            os.close(fd)
        if self.s.s3:
            self._write_store_secrets()
        hosts = [f"{self.s.network.node_ip(n)} {n}" for n in self.s.node_names]
        self._write(self.etc / "hosts", "\n".join(hosts) + "\n")
        (self.run / "munge").mkdir(exist_ok=True, mode=0o755)
        # The plugin is copied so a rebuild in spank/ never changes a running cluster.
        install_file(TOP / "spank" / "bootseer.so", self.dir / "lib" / "bootseer.so")
        plugin = self.dir / "lib" / "bootseer.so"
        if self.s.ssh_install:
            # The nodes' plugin is their install's; sbatch and srun on this machine (the
            # submit host) read the same plugstack line, so the plugin lies here too.
            plugin = INSTALL_PREFIX / "lib" / "slurm" / "bootseer.so"
            plugin.parent.mkdir(parents=True, exist_ok=True)
            install_file(TOP / "spank" / "bootseer.so", plugin)
        (self.dir / "cluster.json").write_text(json.dumps(asdict(self.s), indent=1))
        self._write(self.conf, self._slurm_conf())
        self._write(
            self.etc / "plugstack.conf",
            f"required {plugin} rundir={self.dir}/nodes/%n/run\n",
        )
        if not self.site_config.exists():
            self._write(self.site_config, self._site_config())
        else:
            # A config written before peer-to-peer or the site key: add their sections,
            # keep the admin's edits.
            old = text = self.site_config.read_text()
            if "[p2p]" not in text:
                text += "\n" + self._p2p_section()
            if "key_file" not in text:
                text = self._site_section() + text
            if text != old:
                self._write(self.site_config, text)
        for hook in ("prolog", "epilog"):
            wrapper = self.etc / hook
            self._write(
                wrapper,
                (
                    "#!/bin/sh\n"
                    "# slurm-dev: point the hook at this cluster's site config and venv.\n"
                    f"export BOOTSEER_CONFIG={self.site_config}\n"
                    f"export BOOTSEER_PYTHON={VENV / 'bin' / 'python3'}\n"
                    f"exec {TOP / hook / f'bootseer-{hook}'}\n"
                ),
            )
            wrapper.chmod(0o755)

    def _write_store_secrets(self) -> None:
        """An admin identity for root-run parts (its keys in the root-only secrets file)
        and an anonymous one that may only read and list the phase records (users'
        `bootseer report`): no user writes the store or reads another's snapshots, image
        blocks or records (docs/security.md, "Who reads the store")."""
        if not self.secrets_file.exists():
            fd = os.open(self.secrets_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(
                fd,
                (
                    "# slurm-dev's S3 store: root-run parts write with these (root only).\n"
                    "[store]\n"
                    f'access_key = "admin-{os.urandom(6).hex()}"\n'
                    f'secret_key = "{os.urandom(20).hex()}"\n'
                ).encode(),
            )
            os.close(fd)
        import tomllib

        creds = tomllib.loads(self.secrets_file.read_text())["store"]
        identities = {
            "identities": [
                {
                    "name": "admin",
                    "credentials": [
                        {"accessKey": creds["access_key"], "secretKey": creds["secret_key"]}
                    ],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                },
                {"name": "anonymous", "actions": self._s3_public_actions()},
            ]
        }
        tmp = self.s3_identities.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, json.dumps(identities, indent=1).encode())
        os.close(fd)
        os.replace(tmp, self.s3_identities)

    def _s3_public_actions(self) -> list[str]:
        """SeaweedFS actions scoped to the store's public tops, nothing else: an anonymous
        request elsewhere is AccessDenied. ``Action:bucket/path/*`` is a glob over
        ``bucket/key`` (``*`` spans ``/``; a list request's ``prefix`` is its key); an
        action with a path but no wildcard would only ever match the bare bucket."""
        import sys

        sys.path.insert(0, str(TOP / "lib"))
        from bootseer.store import PUBLIC_TOP

        bucket_path = self.store_uri().removeprefix("s3://").split("?", 1)[0].strip("/")
        return [
            f"{action}:{bucket_path}/{top}/*"
            for top in sorted(PUBLIC_TOP)
            for action in ("Read", "List")
        ] + [
            # slurm-dev only, never bootseer's: the startup benchmark's baseline jobs pull
            # plain objects (image, checkpoint) with curl, as users read a site's shared
            # storage without bootseer (slurm-dev/bench/startup, STORE_PREFIX).
            f"Read:{bucket_path}/bench/*"
        ]

    def _write(self, path: Path, text: str) -> None:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)

    def _slurm_conf(self) -> str:
        d, s = self.dir, self.s
        host = socket.gethostname().split(".")[0]
        lines = [
            "# Written by bootseer's slurm-dev/up: a development cluster on one machine.",
            "ClusterName=bootseerdev",
            f"SlurmctldHost={host}({s.network.host_ip})",
            f"SlurmctldPort={s.port_base}",
            f"SlurmdPort={s.port_base + 1}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.run}/munge/munge.socket.2",
            f"StateSaveLocation={d}/ctld",
            f"SlurmdSpoolDir={d}/spool/%n",
            f"SlurmctldPidFile={self.run}/slurmctld.pid",
            f"SlurmdPidFile={self.run}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.logs}/slurmctld.log",
            f"SlurmdLogFile={self.logs}/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            f"PlugStackConfig={self.etc}/plugstack.conf",
            f"Prolog={self._hook('prolog')}",
            f"Epilog={self._hook('epilog')}",
            # A job's steps wait for every node's prolog (bootseer.slurm.conf says how):
            # the batch script once all are done, any other step past the prolog deadline.
            "PrologFlags=Alloc,DeferBatch",
            "BatchStartTimeout=130",
            "PrologEpilogTimeout=180",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=300",
            "InactiveLimit=0",
            "MinJobAge=600",
            "KillWait=5",
            "MessageTimeout=30",
            "MailProg=/bin/true",
        ]
        for i, node in enumerate(s.node_names, start=1):
            lines.append(
                f"NodeName={node} NodeHostname={host} NodeAddr={s.network.node_ip(node)} "
                f"Port={s.port_base + i} "
                f"CPUs={s.cpus_per_node} RealMemory=4096 State=UNKNOWN"
            )
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _hook(self, hook: str) -> Path:
        if self.s.ssh_install:
            return INSTALL_PREFIX / "libexec" / f"bootseer-{hook}"
        return self.etc / hook

    def _site_config(self) -> str:
        d = self.dir
        return (
            "# bootseer site config for the slurm-dev cluster (written once; edit freely).\n"
            + self._site_section()
            + "[store]\n"
            f'uri = "{self.store_uri()}"\n\n'
            "[paths]\n"
            f'run_dir = "{d}/nodes/%n/run"\n'
            f'cache_dir = "{d}/nodes/%n/cache"\n'
            f'log_dir = "{d}/nodes/%n/log"\n\n'
            "[hooks]\n"
            "strict = false\n"
            "prolog_deadline = 120\n"
            "epilog_deadline = 120\n\n"
            "[ckpt]\n"
            "# Three directories stand in for three storage targets (docs/ckpt.md).\n"
            f'targets = ["file://{d}/ckpt/t1", "file://{d}/ckpt/t2", "file://{d}/ckpt/t3"]\n'
            "unit_size = 4194304\n\n"
            "[image]\n"
            "# socket, cache_dir: <run_dir>/agent.sock, <cache_dir>/image (bootseer.nodepaths)\n"
            f'mount_dir = "{d}/nodes/%n/images"\n'
            "cache_size_gib = 20\n\n"
            "[metrics]\n"
            "# node_exporter's textfile collector would read here (docs/admin.md).\n"
            f'textfile_dir = "{d}/nodes/%n/metrics"\n'
            "interval = 2\n\n" + self._p2p_section()
        )

    def _site_section(self) -> str:
        return (
            "[site]\n"
            "# Root only; seals what root-run parts write to the store, and p2p's tokens.\n"
            f'key_file = "{self.etc}/site.key"\n\n'
        )

    def _p2p_section(self) -> str:
        return (
            "[p2p]\n"
            "# slurm-dev's node names are not in the machine's resolver.\n"
            f'hosts_file = "{self.etc}/hosts"\n'
        )


def install_file(src: Path, dest: Path) -> None:
    """Copy ``src`` to ``dest`` by a rename: a process that has the old ``dest`` loaded
    (slurmstepd and srun map the SPANK plugin) keeps its copy. Copying in place
    (``shutil.copy2``) truncated and rewrote the mapped file under them: they crashed."""
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        shutil.copy2(src, tmp)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
