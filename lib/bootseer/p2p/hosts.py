"""Where a node's agent listens for peers: its name resolved, on the site's peer port.

Clusters resolve node names by DNS or /etc/hosts; ``[p2p] hosts_file`` (the /etc/hosts
format) overrides that, e.g. for slurm-dev, whose node names are not in the machine's
resolver::

    >>> Resolver(746, Path("/etc/bootseer/hosts")).resolve("n2")  # doctest: +SKIP
    ('10.214.40.12', 746)
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from bootseer.errors import ConfigError


class Resolver:
    def __init__(self, port: int, hosts_file: Path | None = None) -> None:
        self.port = port
        self._names: dict[str, str] = {}
        self._lock = threading.Lock()
        if hosts_file is not None:
            self._names.update(read_hosts(hosts_file))

    def resolve(self, node: str) -> tuple[str, int]:
        with self._lock:
            ip = self._names.get(node)
        if ip is None:
            ip = socket.gethostbyname(node)  # OSError (socket.gaierror) when unknown
            with self._lock:
                self._names[node] = ip
        return ip, self.port

    def addresses(self, nodes: list[str] | tuple[str, ...]) -> frozenset[str]:
        """The addresses of those of ``nodes`` that resolve."""
        out = set()
        for n in nodes:
            try:
                out.add(self.resolve(n)[0])
            except OSError:
                continue
        return frozenset(out)


def read_hosts(path: Path) -> dict[str, str]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"p2p.hosts_file {path}: {exc.strerror}") from None
    names: dict[str, str] = {}
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        for name in fields[1:]:
            names.setdefault(name, fields[0])
    return names
