"""The store host's ports besides its S3 gateway: what a user on a node can connect to.

An S3 store answers users on one port, where it checks identities. SeaweedFS (the store
slurm-dev runs, and many sites) also listens on ports that check nothing: its gateway's
gRPC port (the gateway's port + 10000: ``SeaweedS3IamCache/PutIdentity`` mints an
identity with any rights), the master's, volume servers' and filer's HTTP and gRPC
ports (the filer reads and writes any object), the Iceberg catalog and the Lance
namespace server. A site binds them where no user reaches them (the loopback, a
management network) or refuses them on the store host; ``bootseer doctor`` connects to
each from the node (``store exposure``), as a user's process would::

    >>> side_doors("s3://b/p?endpoint_override=store:8333&scheme=http")  # doctest: +SKIP
    []
"""

from __future__ import annotations

import errno
import selectors
import socket
import time
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

GRPC_OFFSET = 10000  # SeaweedFS's gRPC port for a server at HTTP port p: p + 10000
# SeaweedFS's default ports (weed server / weed s3), what each serves.
DEFAULT_PORTS = {
    9333: "master HTTP",
    19333: "master gRPC",
    8080: "volume HTTP",
    18080: "volume gRPC",
    8888: "filer HTTP",
    18888: "filer gRPC",
    8181: "Iceberg catalog",
    9101: "Lance namespace",
    8111: "IAM API",
}
PROBE_TIMEOUT = 5.0  # seconds for all the connects at once; a refused port answers at once


@dataclass(frozen=True)
class SideDoor:
    """A port on the store host that accepted a connection from this node."""

    host: str
    port: int
    what: str

    def __str__(self) -> str:
        return f"{self.host}:{self.port} ({self.what}) accepts connections from this node"


def store_endpoint(uri: str) -> tuple[str, int] | None:
    """(host, port) of an S3 store URI's gateway; None for a store without one."""
    parts = urlsplit(uri)
    if parts.scheme != "s3":
        return None
    endpoint = parse_qs(parts.query).get("endpoint_override", [""])[0]
    if not endpoint:
        return None
    netloc = urlsplit(endpoint if "//" in endpoint else f"//{endpoint}")
    if not netloc.hostname:
        return None
    scheme = parse_qs(parts.query).get("scheme", ["https"])[0]
    return netloc.hostname, netloc.port or (443 if scheme == "https" else 80)


def side_ports(s3_port: int) -> dict[int, str]:
    """The SeaweedFS ports to probe beside a gateway on ``s3_port``."""
    ports = {s3_port + GRPC_OFFSET: "S3 gateway gRPC: PutIdentity mints keys"}
    for port, what in DEFAULT_PORTS.items():
        ports.setdefault(port, what)
    ports.pop(s3_port, None)
    return ports


def side_doors(uri: str, timeout: float = PROBE_TIMEOUT) -> list[SideDoor]:
    """The store host's side ports that accept a TCP connection from here; [] if none
    (or the store has no S3 gateway). All connects run at once, bounded by ``timeout``:
    a port that neither accepts nor refuses in that time counts as unreachable."""
    endpoint = store_endpoint(uri)
    if endpoint is None:
        return []
    host, s3_port = endpoint
    try:
        infos = socket.getaddrinfo(host, s3_port, type=socket.SOCK_STREAM)
    except OSError:
        return []  # the store check says that the store does not answer
    family, _, _, _, addr = infos[0]
    ports = side_ports(s3_port)
    found: list[SideDoor] = []
    sel = selectors.DefaultSelector()
    pending: dict[int, socket.socket] = {}
    try:
        for port, what in ports.items():
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            err = sock.connect_ex((addr[0], port, *addr[2:]))
            if err == 0:
                found.append(SideDoor(host, port, what))
                sock.close()
            elif err in (errno.EINPROGRESS, errno.EAGAIN):
                sel.register(sock, selectors.EVENT_WRITE, (port, what))
                pending[sock.fileno()] = sock
            else:
                sock.close()
        deadline = time.monotonic() + timeout
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for key, _ in sel.select(left):
                sock = pending.pop(key.fd)
                port, what = key.data
                sel.unregister(sock)
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    found.append(SideDoor(host, port, what))
                sock.close()
    finally:
        sel.close()
        for sock in pending.values():
            sock.close()
    return sorted(found, key=lambda d: d.port)
