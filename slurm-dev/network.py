"""slurm-dev's network: every node and the store are hosts on one bridge, each behind a capped link.

::

        host (slurmctld, sbatch, tests)  10.214.T.1 on the bridge bsbr<port>
                              |
        +---------------------+---------------------+---- ...
        | node_mbit           | node_mbit           | store_mbit
     n1 10.214.T.11        n2 10.214.T.12       store 10.214.T.2 (SeaweedFS)
     (netns bsn<port>-n1)  (netns bsn<port>-n2) (netns bsstore<port>)

Each host sits in a network namespace of its own, joined to the bridge by a veth pair
whose two ends are rate-capped with tc (tbf), so whatever a node sends or receives, from
the store or from another node, costs bandwidth on its own link as on a real cluster.
The store's link is the slow, shared one (``store_mbit``); the nodes' links are faster
(``node_mbit``, by default 10x the store's), as a cluster's fabric is faster than its
shared storage. ``T`` comes from the cluster's port base, so clusters side by side do
not collide. Only the network namespace is separate: the nodes share the machine's
filesystems (a unix socket or a FUSE mount under the state dir works from every host).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

NETNS_DIR = Path("/run/netns")


@dataclass(frozen=True)
class Network:
    port_base: int
    nodes: tuple[str, ...]
    node_mbit: int
    store_mbit: int
    store_delay_ms: int = 0

    # -- names and addresses ----------------------------------------------------------

    @property
    def _octet(self) -> int:
        return (self.port_base // 10) % 250

    @property
    def bridge(self) -> str:
        return f"bsbr{self.port_base}"

    @property
    def host_ip(self) -> str:
        """The machine's own address on the bridge (slurmctld listens here)."""
        return f"10.214.{self._octet}.1"

    @property
    def store_ip(self) -> str:
        return f"10.214.{self._octet}.2"

    def node_ip(self, node: str) -> str:
        return f"10.214.{self._octet}.{10 + self.nodes.index(node) + 1}"

    @property
    def store_netns(self) -> str:
        return f"bsstore{self.port_base}"

    def node_netns(self, node: str) -> str:
        return f"bsn{self.port_base}-{node}"

    @property
    def store_link(self) -> str:
        """The bridge side of the store's link: what it receives, the store sent."""
        return f"bsh{self.port_base}"

    def node_link(self, node: str) -> str:
        return f"bsv{self.port_base}{node}"

    def enter(self, node: str) -> list[str]:
        """A command prefix that runs a program in ``node``'s network namespace only
        (unlike ``ip netns exec``, which also gives it a mount namespace of its own)."""
        return ["nsenter", f"--net={NETNS_DIR / self.node_netns(node)}", "--"]

    def enter_store(self) -> list[str]:
        return ["nsenter", f"--net={NETNS_DIR / self.store_netns}", "--"]

    # -- up and down -----------------------------------------------------------------

    def bridge_up(self) -> None:
        if not link_exists(self.bridge):
            sh("ip", "link", "add", self.bridge, "type", "bridge")
            sh("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")

    def node_up(self, node: str) -> None:
        self.bridge_up()
        self._host_up(self.node_netns(node), self.node_link(node), self.node_ip(node))
        self._cap(self.node_netns(node), self.node_link(node), self.node_mbit, 0)

    def store_up(self) -> None:
        self.bridge_up()
        self._host_up(self.store_netns, self.store_link, self.store_ip)
        self._cap(self.store_netns, self.store_link, self.store_mbit, self.store_delay_ms)

    def _host_up(self, ns: str, link: str, ip: str) -> None:
        """A namespace ``ns`` whose eth0 (``ip``/24) is joined to the bridge by ``link``."""
        if netns_exists(ns) and link_exists(link):
            return
        sh("ip", "netns", "del", ns, check=False)  # half made by an interrupted up
        sh("ip", "link", "del", link, check=False)
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", link, "master", self.bridge, "up")
        inside = ["ip", "netns", "exec", ns]
        sh(*inside, "ip", "addr", "add", f"{ip}/24", "dev", "eth0")
        sh(*inside, "ip", "link", "set", "eth0", "up")
        sh(*inside, "ip", "link", "set", "lo", "up")

    def _cap(self, ns: str, link: str, mbit: int, delay_ms: int) -> None:
        """Cap both directions: ``link`` (towards the host) and eth0 (from it)."""
        cap_device(link, [], mbit, delay_ms)
        cap_device("eth0", ["ip", "netns", "exec", ns], mbit, delay_ms)

    def down(self) -> None:
        """Remove every namespace, link and the bridge this network made (none may be left)."""
        for node in self.nodes:
            sh("ip", "netns", "del", self.node_netns(node), check=False)
            sh("ip", "link", "del", self.node_link(node), check=False)
        self.store_down()
        sh("ip", "link", "del", self.bridge, check=False)

    def store_down(self) -> None:
        sh("ip", "netns", "del", self.store_netns, check=False)
        sh("ip", "link", "del", self.store_link, check=False)

    # -- counters ---------------------------------------------------------------------

    def store_egress_bytes(self) -> int:
        """Bytes the store has sent on its link since the link was made."""
        return link_counter(self.store_link, "rx_bytes")

    def node_caps(self, node: str) -> tuple[float | None, float | None]:
        """The caps (Mbit/s) the kernel holds for ``node``'s link: towards it, from it."""
        return cap_mbit(self.node_link(node)), cap_mbit("eth0", self.enter(node))

    def store_caps(self) -> tuple[float | None, float | None]:
        return cap_mbit(self.store_link), cap_mbit("eth0", self.enter_store())

    def node_rx_bytes(self, node: str) -> int:
        """Bytes ``node`` has received on its link (from the store and from peers)."""
        return link_counter(self.node_link(node), "tx_bytes")


def cap_device(dev: str, prefix: list[str], mbit: int, delay_ms: int = 0) -> None:
    """Cap the rate of what ``dev`` sends; add delay where the kernel has netem."""
    rate = f"{mbit}mbit"
    if delay_ms:
        netem = [*prefix, "tc", "qdisc", "replace", "dev", dev, "root", "netem"]
        netem += ["rate", rate, "delay", f"{delay_ms}ms", "limit", "100000"]
        if subprocess.run(netem, capture_output=True).returncode == 0:
            return
        print(
            f"slurm-dev: this kernel has no netem: {dev} gets the rate cap without "
            f"the {delay_ms} ms delay",
            file=sys.stderr,
        )
    # burst: enough for the rate at a 1 ms timer tick, never below one jumbo frame.
    burst = max(mbit * 1_000_000 // 8 // 250, 16_000)
    tbf = ["tbf", "rate", rate, "burst", str(burst), "latency", "100ms"]
    sh(*prefix, "tc", "qdisc", "replace", "dev", dev, "root", *tbf)


def cap_mbit(dev: str, prefix: list[str] | None = None) -> float | None:
    """The rate (Mbit/s) of ``dev``'s root qdisc (tbf, or netem's rate), or None."""
    r = subprocess.run(
        [*(prefix or []), "tc", "-j", "qdisc", "show", "dev", dev],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        return None
    for qdisc in json.loads(r.stdout or "[]"):
        if qdisc.get("root"):
            rate = qdisc.get("options", {}).get("rate")
            if isinstance(rate, dict):  # netem: {"rate": bytes per second, ...}
                rate = rate.get("rate")
            return rate * 8 / 1e6 if isinstance(rate, int | float) else None
    return None


def link_exists(dev: str) -> bool:
    return Path("/sys/class/net", dev).exists()


def netns_exists(ns: str) -> bool:
    return (NETNS_DIR / ns).exists() and sh("ip", "netns", "exec", ns, "true", check=False)


def link_counter(dev: str, name: str) -> int:
    return int(Path("/sys/class/net", dev, "statistics", name).read_text())


def sh(*cmd: str, check: bool = True) -> bool:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise SystemExit(
            f"slurm-dev: {' '.join(cmd)} failed ({r.returncode}): {(r.stderr or r.stdout).strip()}"
        )
    return r.returncode == 0
