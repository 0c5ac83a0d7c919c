"""An sshd per slurm-dev node, so ``bootseer install`` and ``bootseer doctor`` reach the
nodes as they reach a cluster's: over SSH, by name, with known host keys.

Each node's sshd is Debian's ``/usr/sbin/sshd -D`` with a config, host key and log of
its own under ``<state>/nodes/<node>/ssh/``, started in the node's network namespace
(it listens on the node's address, port 22) and in a mount namespace of its own in
which :data:`NODE_ROOT` is the node's own root directory (``<state>/nodes/<node>/root``
bound there). The nodes share one filesystem; so an install puts its prefix under
``NODE_ROOT`` and every node gets the same paths (one ``Prolog=`` line in slurm.conf,
venvs whose shebangs name the path they run at) with different bytes behind them, as
the node-local directory (``NODE_LOCAL``) does for jobs. A node's slurmd, agent and
jobs see ``NODE_ROOT`` the same way, by the same bind. The host's own sshd (the
package's service) is never started: bootstrap installs the package with a
``policy-rc.d`` that refuses.

``<state>/etc/ssh/`` holds the admin side: root's key pair for the nodes, their
``known_hosts`` and an OpenSSH client config (``Host n1`` -> its address, the key, the
known hosts) that ``bootseer install --ssh-config`` and ``ssh -F`` read.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from daemons import ours, stop_pid, wait_for, write_pidfile
from devconfig import NODE_ROOT
from network import Network

SSHD = "/usr/sbin/sshd"


class ClusterSsh:
    """The admin side of the cluster's SSH and one sshd per node."""

    def __init__(
        self, state_dir: Path, network: Network, session_env: dict[str, str] | None = None
    ) -> None:
        self.dir = state_dir
        self.net = network
        # What a login on the node finds set, as a real node's /etc/environment would
        # (slurm-dev's slurm.conf and site config are not at the default paths).
        self.session_env = session_env or {}
        self.etc = state_dir / "etc" / "ssh"
        self.key = self.etc / "id_ed25519"
        self.known_hosts = self.etc / "known_hosts"
        self.config = self.etc / "config"

    # -- files -------------------------------------------------------------------------

    def node_dir(self, node: str) -> Path:
        return self.dir / "nodes" / node / "ssh"

    def node_root(self, node: str) -> Path:
        """What the node sees at NODE_ROOT."""
        return self.dir / "nodes" / node / "root"

    def write_config(self) -> None:
        self.etc.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self.key.exists():
            keygen(self.key, "bootseer slurm-dev admin")
        known, client = [], []
        for node in self.net.nodes:
            d = self.node_dir(node)
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
            root = self.node_root(node)
            root.mkdir(parents=True, exist_ok=True)
            root.chmod(0o755)
            host_key = d / "host_ed25519"
            if not host_key.exists():
                keygen(host_key, f"{node} host key")
            pub = (d / "host_ed25519.pub").read_text().split()[:2]
            ip = self.net.node_ip(node)
            known.append(f"{ip} {' '.join(pub)}")
            client += [
                f"Host {node}",
                f"    HostName {ip}",
                "    User root",
                f"    IdentityFile {self.key}",
                f"    UserKnownHostsFile {self.known_hosts}",
                "    StrictHostKeyChecking yes",
                "    BatchMode yes",
                "",
            ]
            (d / "sshd_config").write_text(
                "# slurm-dev: this node's sshd (slurm-dev/sshd.py); never the host's.\n"
                f"ListenAddress {ip}\n"
                "Port 22\n"
                f"HostKey {host_key}\n"
                "PidFile none\n"
                f"AuthorizedKeysFile {self.key}.pub\n"
                "PermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\n"
                "UsePAM no\n"
                # The key lies under the state dir, which /var/tmp (1777) holds.
                "StrictModes no\n"
                "Subsystem sftp internal-sftp\n"
                # One SetEnv line: sshd takes the first of several.
                + "".join(
                    f"SetEnv {' '.join(f'{k}={v}' for k, v in self.session_env.items())}\n"
                    for _ in [1]
                    if self.session_env
                )
                + "LogLevel ERROR\n"
            )
        self.known_hosts.write_text("\n".join(known) + "\n")
        self.config.write_text("\n".join(client))

    # -- daemons -----------------------------------------------------------------------

    def pidfile(self, node: str) -> Path:
        return self.node_dir(node) / "sshd.pid"

    def alive(self, node: str) -> int | None:
        return ours(self.pidfile(node), ("sshd", "-D"))

    def start(self, node: str) -> None:
        if self.alive(node):
            return
        d = self.node_dir(node)
        NODE_ROOT.mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        script = 'mount --bind "$1" "$2" && exec "$3" -D -e -f "$4"'
        cmd = [*self.net.enter(node), "unshare", "--mount", "sh", "-c", script, "sshd"]
        cmd += [str(self.node_root(node)), str(NODE_ROOT), SSHD, str(d / "sshd_config")]
        with open(d / "sshd.log", "ab") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
            )
        write_pidfile(self.pidfile(node), proc.pid)
        ip = self.net.node_ip(node)

        def listening() -> bool:
            if proc.poll() is not None:
                raise SystemExit(f"slurm-dev: {node}'s sshd exited: {(d / 'sshd.log').read_text()}")
            r = subprocess.run(
                [*self.net.enter(node), "ss", "-Hltn", f"src {ip}:22"],
                capture_output=True,
                text=True,
            )
            return bool(r.stdout.strip())

        wait_for(listening, 20, f"{node}'s sshd on {ip}:22")

    def stop(self, node: str) -> None:
        pid = self.alive(node)
        if pid:
            stop_pid(pid, "sshd")
        self.pidfile(node).unlink(missing_ok=True)

    def up(self) -> None:
        self.write_config()
        for node in self.net.nodes:
            self.start(node)

    def down(self) -> None:
        for node in self.net.nodes:
            self.stop(node)


def keygen(path: Path, comment: str) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    os.chmod(path, 0o600)
