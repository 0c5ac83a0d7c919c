"""A real Slurm cluster on one machine, for development, demos, tests and benchmarks.

Debian's Slurm is built with multiple-slurmd, so N ``slurmd -N nX`` processes, each with
its own port, spool, pid and log file, make an N-node cluster beside one slurmctld and
one munged of our own. Everything lives under one state directory::

    etc/      slurm.conf, plugstack.conf, bootseer.toml, prolog/epilog wrappers, munge.key
    run/      pid files, munge socket
    log/      slurmctld.log, slurmd-nX.log, munged.log, weed.log
    spool/    slurmd spools; ctld/ slurmctld state
    nodes/nX/ bootseer's node-local run, cache and log dirs (site config paths use %n)
    store/    the file:// store (without --s3)

It never touches the host's /etc/slurm. ``up`` is safe to run again; ``down`` stops
exactly what ``up`` started, by pid, and leaves no mounts.

The network (:mod:`network`): each node is a host in its own network namespace with
its own address and a capped link to a bridge (``--node-mbit``); the S3 store host
(``--s3``: SeaweedFS) sits on the same bridge behind a slower capped link
(``--store-mbit``), delayed with netem where the kernel has it. slurmctld listens on
the machine's own address on the bridge.

The pieces, one concern each: devconfig.py (the settings and the files rendered from
them), daemons.py (starting, watching and stopping processes), storehost.py (the S3
store host), network.py (namespaces, bridge, capped links). This module puts them
together as :class:`Cluster` and is the command line of ``slurm-dev/up|down|env``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

# The pieces, re-exported: tests and benches use them as devcluster.X.
from daemons import USERS as USERS
from daemons import as_user as as_user
from daemons import ensure_users
from daemons import stop_pid as stop_pid
from daemons import user_env as user_env
from daemons import wait_for as wait_for
from devconfig import DEFAULT_PORT_BASE, DEFAULT_STATE, TOP
from devconfig import INSTALL_ETC as INSTALL_ETC
from devconfig import INSTALL_PREFIX as INSTALL_PREFIX
from devconfig import NODE_LOCAL as NODE_LOCAL
from devconfig import NODE_ROOT as NODE_ROOT
from devconfig import VENV as VENV
from devconfig import Settings as Settings
from devconfig import install_file as install_file
from sshd import ClusterSsh
from storehost import StoreHost


class Cluster(StoreHost):
    """One cluster: its config (devconfig), daemons (daemons) and store host (storehost)."""

    @classmethod
    def load(cls, state_dir: Path) -> Cluster:
        data = json.loads((state_dir / "cluster.json").read_text())
        return cls(Settings(**data))

    def up(self) -> None:
        t0 = time.monotonic()
        ensure_users()
        self.write_config()
        self.share_state_dir()
        for node in self.s.node_names:
            self.s.network.node_up(node)
        if self.s.s3:
            self.store_host_up()
        if self.s.ssh_install:
            self.ssh.up()
            self.install_over_ssh()
        for node in self.s.node_names:
            self.start_agent(node)
        self.start_munged()
        self.start_slurmctld()
        for node in self.s.node_names:
            self.start_slurmd(node)
        self.wait_idle()
        print(
            f"slurm-dev: {self.s.nodes} nodes idle in {time.monotonic() - t0:.1f}s "
            f"(state {self.dir}; `eval $({TOP}/slurm-dev/env)` to use it)"
        )

    @property
    def ssh(self) -> ClusterSsh:
        """The nodes' sshd and the admin's client config (--install-over-ssh)."""
        env = {"SLURM_CONF": str(self.conf), "BOOTSEER_CONFIG": str(INSTALL_ETC / "config.toml")}
        return ClusterSsh(self.dir, self.s.network, env)

    def install_over_ssh(self, config: Path | None = None) -> str:
        """`bootseer install` onto every node, as an admin installs a cluster's; agents
        already running restart in place where they run an older install (once idle).
        Returns what it printed."""
        cmd = [str(VENV / "bin" / "bootseer"), "install", ",".join(self.s.node_names)]
        cmd += ["--config", str(config or self.site_config), "--ssh-config", str(self.ssh.config)]
        cmd += ["--prefix", str(INSTALL_PREFIX), "--etc", str(INSTALL_ETC), "--unit-dir", "none"]
        cmd += ["--bin-dir", str(NODE_ROOT / "bin"), "--slurm-conf", str(self.conf)]
        cmd += ["--build-dir", str(self.dir / "build"), "--restart-agents"]
        r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **self.env()})
        print(r.stdout, end="")
        if r.returncode != 0:
            raise SystemExit(f"slurm-dev: bootseer install failed:\n{r.stderr}{r.stdout}")
        return r.stdout

    def down(self) -> None:
        if self.s.ssh_install:
            self.ssh.down()
        super().down()


# -- command line --------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="slurm-dev")
    p.add_argument("action", choices=["up", "down", "env"])
    p.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE,
        help=f"where all state lives (default {DEFAULT_STATE}; $BOOTSEER_DEV_STATE)",
    )
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument(
        "--port-base",
        type=int,
        default=DEFAULT_PORT_BASE,
        help="slurmctld's port; slurmd nX listen on base+X ($BOOTSEER_DEV_PORT_BASE)",
    )
    p.add_argument("--s3", action="store_true", help="run the S3 store host (SeaweedFS)")
    p.add_argument("--store-mbit", type=int, default=200, help="store link rate cap")
    p.add_argument("--store-delay-ms", type=int, default=0, help="store link delay (needs netem)")
    p.add_argument(
        "--node-mbit",
        type=int,
        default=0,
        help="each node's link rate cap (default: 10x --store-mbit)",
    )
    p.add_argument(
        "--node-fs-gib",
        type=int,
        default=0,
        help="give each node's local directory a journaled ext4 of this size (a loop "
        "device), as a node's local disk; default: a directory of the state dir",
    )
    p.add_argument(
        "--install-over-ssh",
        action="store_true",
        help="give each node an sshd and install bootseer on them with `bootseer install`",
    )
    args = p.parse_args(argv)
    state = args.state_dir.resolve()
    if args.action == "env":
        cluster = (
            Cluster.load(state)
            if (state / "cluster.json").exists()
            else Cluster(Settings(str(state)))
        )
        for k, v in cluster.env().items():
            print(f"export {k}={v}")
        return 0
    refuse_another_checkouts(state)
    if os.geteuid() != 0:
        raise SystemExit("slurm-dev: run as root (it starts slurmd, munged and mounts)")
    if args.action == "down":
        if (state / "cluster.json").exists():
            Cluster.load(state).down()
        (state / "checkout").unlink(missing_ok=True)  # a stopped cluster is nobody's
        return 0
    if args.nodes < 1 or args.nodes > 64:
        raise SystemExit("slurm-dev: --nodes must be 1..64")
    settings = Settings(
        str(state),
        args.nodes,
        args.port_base,
        args.s3,
        args.store_mbit,
        args.store_delay_ms,
        node_mbit=args.node_mbit,
        ssh_install=args.install_over_ssh,
        node_fs_gib=args.node_fs_gib,
    )
    if (state / "cluster.json").exists():
        old = Cluster.load(state)
        if asdict(old.s) != asdict(settings) and any(old.alive(n) for n in old.pidfiles()):
            print("slurm-dev: settings changed: restarting the cluster", file=sys.stderr)
            old.down()
        if old.s.s3 != settings.s3:
            (state / "etc" / "bootseer.toml").unlink(missing_ok=True)
    state.mkdir(parents=True, exist_ok=True)
    (state / "checkout").write_text(f"{TOP}\n")
    Cluster(settings).up()
    return 0


def refuse_another_checkouts(state: Path) -> None:
    """A cluster belongs to the checkout that started it: its hook wrappers and agents run
    that checkout's code. Another clone's `up` or `down` on it (both default to the same
    state dir and ports) would repoint or stop it: refused, with what to do instead."""
    try:
        owner = (state / "checkout").read_text().strip()
    except FileNotFoundError:
        return
    if owner and owner != str(TOP) and Path(owner).is_dir():
        raise SystemExit(
            f"slurm-dev: {state} is the cluster of another checkout, {owner}; this one is "
            f"{TOP}. Give this checkout a cluster of its own: BOOTSEER_DEV_STATE=DIR "
            f"BOOTSEER_DEV_PORT_BASE=PORT (or --state-dir, --port-base), or remove "
            f"{state / 'checkout'} if {owner} no longer uses it."
        )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
