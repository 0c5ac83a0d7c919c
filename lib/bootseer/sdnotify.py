"""systemd's readiness protocol (``sd_notify``), for ``Type=notify`` units.

A service started by systemd with ``Type=notify`` finds ``$NOTIFY_SOCKET`` (a path, or
``@name`` in the abstract namespace) and sends ``READY=1`` there once it serves; units
ordered after it (slurmd: ``Before=slurmd.service`` in the agent's unit) start only
then. Elsewhere (slurm-dev, a shell) there is no socket and nothing is sent.

    >>> notify("READY=1", env={})
    False
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


def notify(state: str, env: Mapping[str, str] = os.environ) -> bool:
    """Send ``state`` (``READY=1``, ``STOPPING=1``) to systemd; whether there was a socket."""
    addr = env.get("NOTIFY_SOCKET", "")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
        s.connect(addr)
        s.sendall(state.encode())
    return True
