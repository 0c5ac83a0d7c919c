"""slurm-dev's network: nodes are hosts on a bridge, each behind a capped link."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from network import Network

from tests.conftest import TEST_PORT_BASE

pytestmark = pytest.mark.root

RECEIVE = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 19999)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); n = 0
while chunk := c.recv(1 << 20):
    n += len(chunk)
print(n, time.monotonic(), flush=True)
"""
# The sender says when it began (one monotonic clock for the whole machine): the time
# from there to the receiver's last byte is never shorter than the transfer took, so
# the rate is never overstated, however late either process was scheduled.
SEND = """
import socket, sys, time
print(time.monotonic(), flush=True)
c = socket.create_connection((sys.argv[1], 19999), timeout=30)
c.sendall(b"x" * int(sys.argv[2])); c.close()
"""


@pytest.fixture
def net() -> Iterator[Network]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    net = Network(TEST_PORT_BASE + 30, ("n1", "n2", "n3"), node_mbit=80, store_mbit=40)
    net.down()
    try:
        for node in net.nodes:
            net.node_up(node)
        yield net
    finally:
        net.down()


def transfer(net: Network, src: str, dst: str, size: int) -> float:
    """Mbit/s of one TCP stream from ``src`` to ``dst``, as the receiver saw it."""
    rx = subprocess.Popen(
        [*net.enter(dst), sys.executable, "-c", RECEIVE, net.node_ip(dst)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert rx.stdout is not None and rx.stdout.readline().strip() == "ready"
        tx = subprocess.run(
            [*net.enter(src), sys.executable, "-c", SEND, net.node_ip(dst), str(size)],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        )
        got, end = rx.stdout.readline().split()
        assert int(got) == size
        return size * 8 / (float(end) - float(tx.stdout)) / 1e6
    finally:
        rx.kill()
        rx.wait()


def test_node_to_node_traffic_crosses_capped_links(net: Network) -> None:
    before = net.node_rx_bytes("n2")
    mbit = transfer(net, "n1", "n2", 4 << 20)
    print(f"n1 -> n2: {mbit:.1f} Mbit/s against a cap of {net.node_mbit}")
    # The cap holds (a rate is never overstated); that the link carries the cap when the
    # machine is idle is a benchmark's question: here, the kernel holds the right cap.
    assert mbit <= net.node_mbit * 1.1
    assert net.node_caps("n1") == net.node_caps("n2") == (net.node_mbit, net.node_mbit)
    assert net.node_rx_bytes("n2") - before >= 4 << 20


def test_each_node_has_its_own_address_and_namespace(net: Network) -> None:
    seen = set()
    for node in net.nodes:
        r = subprocess.run(
            [*net.enter(node), "ip", "-o", "-4", "addr", "show", "dev", "eth0"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert net.node_ip(node) + "/24" in r.stdout
        seen.add(os.stat(f"/run/netns/{net.node_netns(node)}").st_ino)
    assert len(seen) == len(net.nodes)


def test_up_is_idempotent_and_down_is_exact(net: Network) -> None:
    net.node_up("n1")  # again: nothing changes, nothing fails
    assert transfer(net, "n3", "n1", 1 << 20) > 0
    net.down()
    links = os.listdir("/sys/class/net")
    assert not [dev for dev in links if str(net.port_base) in dev]
    assert not [ns for ns in os.listdir("/run/netns") if str(net.port_base) in ns]
    net.down()  # a second down finds nothing and fails on nothing
