"""The emulator's network: slurm-dev's (``network.py``), wide enough for hundreds of nodes.

Every emulated node is a host in a network namespace of its own, joined to one bridge by
a veth pair capped both ways with tc (tbf), as in ``slurm-dev/network.py``, whose names,
counters and caps this reuses. Two things differ, both for size:

- addresses come from a /16 (``10.<T>.0.0``, T from the port base), not a /24, so more
  than 244 nodes fit;
- namespaces, links and caps are made with a few batched ``ip`` and ``tc`` calls
  (``-batch``, ``-n``), not a dozen processes per node: 256 nodes come up in seconds
  on a loaded 2-core machine;
- **no ARP, no IPv6**: the kernel's neighbour table is one for all network namespaces
  (``net.ipv4.neigh.default.gc_thresh3``, 1,024 entries here, shared with every other
  dev cluster on the machine). At 128 nodes the emulator's own ARP entries (each node's
  peers and the store, in each namespace) overflowed it ("neighbor table overflow") and
  broke the other sessions' clusters. The emulator knows every host's address and gives
  each a MAC of its own (:func:`mac`), so it installs every other host as a *permanent*
  neighbour in each namespace: permanent entries are not counted against the
  thresholds (Linux >= 4.20, ``neigh_alloc``'s ``exempt_from_gc``; checked on this
  machine's 6.18: 600 permanent entries left ``forced_gc_runs`` still, 600 stale ones
  started it), and no node ever resolves one. Links get no IPv6 address
  (``addrgenmode none``): no link-local address, no DAD, router solicitation or MLD,
  none of the multicast neighbour entries that 2 x 257 links would add to the IPv6
  table (1,024 too). Host sysctls are left alone. ``node.py`` reports each namespace's
  table (``/proc/net/arp``) and ``bench.py`` the kernel's counters around each run.

A node's link can be re-capped between runs (``slow``) to emulate a slow node.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # slurm-dev/

from network import Network, cap_device, link_exists, sh


def burst(mbit: float) -> int:
    """tbf's bucket: the rate at a 1 ms tick, never below one jumbo frame (as network.py)."""
    return max(int(mbit * 1_000_000 // 8 // 250), 16_000)


def tbf(dev: str, mbit: float) -> str:
    """A tbf cap whose queue holds a second of the link's bytes (at least 64 KiB).

    slurm-dev's ``latency 100ms`` is a 1.25 MB queue at 100 Mbit/s but 10 KB at the
    emulator's 0.8: a hundred flows then lose packets in every burst and sit out TCP's
    retransmission back-off (runs stalled for minutes with the link idle)."""
    limit = max(int(mbit * 1_000_000 / 8), 64 << 10)
    return f"qdisc replace dev {dev} root tbf rate {mbit:g}mbit burst {burst(mbit)} limit {limit}"


@dataclass(frozen=True)
class SwarmNetwork(Network):
    @property
    def _second(self) -> int:
        # 10.<T>.0.0/16; never 214 (slurm-dev's clusters' /24s live in 10.214.0.0/16).
        t = 100 + (self.port_base // 10) % 100
        return t

    @property
    def host_ip(self) -> str:
        return f"10.{self._second}.0.1"

    @property
    def store_ip(self) -> str:
        return f"10.{self._second}.0.2"

    def node_ip(self, node: str) -> str:
        i = self.nodes.index(node) + 1
        return f"10.{self._second}.{1 + i // 250}.{i % 250 + 1}"

    def node_netns(self, node: str) -> str:
        return f"bsw{self.port_base}-{node}"

    @property
    def store_netns(self) -> str:
        return f"bswstore{self.port_base}"

    @property
    def bridge(self) -> str:
        return f"bswbr{self.port_base}"

    @property
    def store_link(self) -> str:
        return f"bswh{self.port_base}"

    def node_link(self, node: str) -> str:
        return f"bsw{self.port_base}{node}"

    def up(self) -> None:
        """The bridge, the store host and every node host, capped, each knowing every
        other's MAC (permanent neighbour entries: no ARP)."""
        self.down()
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "link", "set", self.bridge, "addrgenmode", "none")
        sh("ip", "addr", "add", f"{self.host_ip}/16", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        hosts = [(self.store_netns, self.store_link, self.store_ip, self.store_mbit)]
        hosts += [
            (self.node_netns(n), self.node_link(n), self.node_ip(n), self.node_mbit)
            for n in self.nodes
        ]
        lines = []
        for ns, link, ip, _ in hosts:
            lines.append(f"netns add {ns}")
            lines.append(f"link add {link} type veth peer name eth0 address {mac(ip)} netns {ns}")
            lines.append(f"link set {link} addrgenmode none")
            lines.append(f"link set {link} master {self.bridge} up")
        batch(["ip", "-batch", "-"], lines)
        batch(["tc", "-batch", "-"], [tbf(link, mbit) for _, link, _, mbit in hosts])
        for ns, _, ip, mbit in hosts:
            neigh = [
                f"neigh replace {other} lladdr {mac(other)} dev eth0 nud permanent"
                for _, _, other, _ in hosts
                if other != ip
            ]
            batch(
                ["ip", "-n", ns, "-batch", "-"],
                [f"addr add {ip}/16 dev eth0", "link set eth0 addrgenmode none",
                 "link set eth0 up", "link set lo up", *neigh],
            )  # fmt: skip
            batch(["tc", "-n", ns, "-batch", "-"], [tbf("eth0", mbit)])

    def cap(self, node: str, mbit: float) -> None:
        """Re-cap ``node``'s link both ways (a slow node: a tenth of the others')."""
        batch(["tc", "-batch", "-"], [tbf(self.node_link(node), mbit)])
        batch(["tc", "-n", self.node_netns(node), "-batch", "-"], [tbf("eth0", mbit)])

    def down(self) -> None:
        lines = [f"netns del {self.node_netns(n)}" for n in self.nodes]
        lines.append(f"netns del {self.store_netns}")
        # -force: go on past namespaces that are not there
        subprocess.run(["ip", "-force", "-batch", "-"], input="\n".join(lines) + "\n",
                       capture_output=True, text=True)  # fmt: skip
        for link in [self.node_link(n) for n in self.nodes] + [self.store_link]:
            if link_exists(link):
                sh("ip", "link", "del", link, check=False)
        if link_exists(self.bridge):
            sh("ip", "link", "del", self.bridge, check=False)

    def node_tx_bytes(self, node: str) -> int:
        """Bytes ``node`` has sent on its link (to peers, and its requests to the store)."""
        return int(Path("/sys/class/net", self.node_link(node), "statistics", "rx_bytes")
                   .read_text())  # fmt: skip


def mac(ip: str) -> str:
    """A host's MAC, from its address: locally administered (02:), unique per bridge."""
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"02:00:{a:02x}:{b:02x}:{c:02x}:{d:02x}"


def neigh_stats() -> dict[str, int]:
    """The kernel's IPv4 neighbour table, all namespaces together (/proc/net/stat/arp_cache):
    entries (permanent ones included), forced garbage collections and overflows so far."""
    rows = [line.split() for line in Path("/proc/net/stat/arp_cache").read_text().splitlines()]
    cpus = rows[1:]
    return {
        "entries": int(cpus[0][0], 16),
        "forced_gc_runs": sum(int(r[10], 16) for r in cpus),
        "table_fulls": sum(int(r[12], 16) for r in cpus),
    }


def batch(cmd: list[str], lines: list[str]) -> None:
    r = subprocess.run(cmd, input="\n".join(lines) + "\n", capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"swarm bench: {' '.join(cmd)} failed: {(r.stderr or r.stdout)[-2000:]}")


__all__ = ["SwarmNetwork", "cap_device", "mac", "neigh_stats"]
