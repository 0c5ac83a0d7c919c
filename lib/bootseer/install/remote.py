"""One SSH connection to a node (paramiko): run a command, read and write files.

Host names, users, ports, identities, ``ProxyJump`` (each hop through the one before)
and ``ProxyCommand`` come from an OpenSSH client config (``--ssh-config``, default
``~/.ssh/config``), as ``ssh`` would read them; host keys
must already be known (``known_hosts``, or the config's ``UserKnownHostsFile``): an
unknown or changed key is refused, never accepted silently. Files are written to a
temporary name beside the target, given their mode and owner, then renamed onto it,
so no reader ever sees half a file (slurmstepd keeps a replaced plugin mapped).
"""

from __future__ import annotations

import io
import os
import shlex
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko

from bootseer.errors import BootseerError, describe

DEFAULT_SSH_CONFIG = Path("~/.ssh/config").expanduser()


MAX_JUMPS = 8  # ProxyJump hops followed, jump hosts' own included


def _hop(spec: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` (a ProxyJump hop; ``ssh://`` URIs too) as (user, host, port).

    >>> _hop("admin@gw.example:2222"), _hop("gw")
    (('admin', 'gw.example', 2222), (None, 'gw', None))
    """
    spec = spec.strip().removeprefix("ssh://")
    user, _, hostport = spec.rpartition("@")
    host, sep, port = hostport.rpartition(":") if hostport.count(":") == 1 else ("", "", "")
    if not sep:
        host, port = hostport.strip("[]"), ""
    return user or None, host, int(port) if port else None


def _channel(via: paramiko.SSHClient, hostname: str, port: int, name: str) -> paramiko.Channel:
    """A TCP connection to ``hostname:port`` opened by ``via``'s host (``ssh -W``)."""
    transport = via.get_transport()
    if transport is None:
        raise RemoteError(f"ssh: the session to jump host {name} closed")
    try:
        return transport.open_channel("direct-tcpip", (hostname, port), ("127.0.0.1", 0))
    except (paramiko.SSHException, OSError) as exc:
        raise RemoteError(
            f"ssh: jump host {name} could not reach {hostname}:{port}: {describe(exc)}"
        ) from None


class RemoteError(BootseerError):
    """A node could not be reached, or a command on it failed."""


@dataclass(frozen=True)
class Result:
    status: int
    out: str
    err: str


class Node:
    """An open SSH session to ``name`` (a context manager)."""

    def __init__(self, name: str, ssh_config: Path | None = None, timeout: float = 20) -> None:
        self.name = name
        cfg = paramiko.SSHConfig()
        path = ssh_config or DEFAULT_SSH_CONFIG
        if path.exists():
            cfg = paramiko.SSHConfig.from_path(str(path))
        self._cfg, self._timeout = cfg, timeout
        # The jump hosts' sessions (ProxyJump), each carrying the next hop's connection.
        self._jumps: list[paramiko.SSHClient] = []
        self._depth = 0  # jump hosts' own ProxyJump followed so far (a loop ends)
        try:
            self.client = self._connect(name)
            self.sftp = self.client.open_sftp()
        except BaseException:
            self._close_jumps()
            raise

    def _connect(
        self, alias: str, user: str | None = None, port: int | None = None, sock: Any = None
    ) -> paramiko.SSHClient:
        """A session to ``alias`` as the config describes it (``user``, ``port``: a
        ProxyJump hop's own), over ``sock`` (from the hop before), else through its
        ProxyJump hosts or ProxyCommand if it names any."""
        host = self._cfg.lookup(alias)
        hostname = host.get("hostname", alias)
        port = port or int(host.get("port", 22))
        if sock is None:
            sock = self._through(host, hostname, port)
        client = paramiko.SSHClient()
        client.load_system_host_keys()
        for known in host.get("userknownhostsfile", "").split():
            known = os.path.expanduser(known)
            if os.path.exists(known):
                client.load_host_keys(known)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        via = f" (through {host['proxyjump']})" if "proxyjump" in host else ""
        try:
            client.connect(
                hostname,
                port=port,
                username=user or host.get("user", "root"),
                key_filename=[os.path.expanduser(k) for k in host.get("identityfile", [])] or None,
                timeout=self._timeout,
                banner_timeout=self._timeout,
                auth_timeout=self._timeout,
                sock=sock,
            )
        except paramiko.SSHException as exc:
            client.close()
            raise RemoteError(
                f"ssh {alias}{via}: {describe(exc)} (is its host key in known_hosts?)"
            ) from None
        except OSError as exc:
            client.close()
            raise RemoteError(f"ssh {alias}{via}: {exc.strerror or exc}") from None
        return client

    def _through(self, host: paramiko.SSHConfigDict, hostname: str, port: int) -> Any:
        """What carries the connection to ``hostname:port``: a channel through the last
        of ``host``'s ProxyJump hosts (each reached through the one before, as ssh does),
        its ProxyCommand, or None (a direct TCP connection)."""
        jumps = host.get("proxyjump", "none")
        if jumps.lower() != "none":
            self._depth += 1
            if self._depth > MAX_JUMPS:
                raise RemoteError(f"ssh: more than {MAX_JUMPS} ProxyJump hops (a loop?)")
            hops = [_hop(h) for h in jumps.split(",")]
            first_user, first_host, first_port = hops[0]
            last = self._connect(first_host, first_user, first_port)
            self._depth -= 1
            self._jumps.append(last)
            for user, alias, hop_port in hops[1:]:
                entry = self._cfg.lookup(alias)
                to = (entry.get("hostname", alias), hop_port or int(entry.get("port", 22)))
                last = self._connect(alias, user, hop_port, sock=_channel(last, *to, alias))
                self._jumps.append(last)
            return _channel(last, hostname, port, jumps)
        command = host.get("proxycommand", "none")
        if command.lower() != "none":
            return paramiko.ProxyCommand(command)
        return None

    def _close_jumps(self) -> None:
        for jump in reversed(self._jumps):
            jump.close()
        self._jumps.clear()

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sftp.close()
        self.client.close()
        self._close_jumps()

    def run(self, argv: list[str], stdin: bytes = b"", timeout: float = 600) -> Result:
        """``argv`` run by the node's shell, each word quoted."""
        return self.sh(shlex.join(argv), stdin, timeout)

    def sh(self, script: str, stdin: bytes = b"", timeout: float = 600) -> Result:
        chan_in, out, err = self.client.exec_command(script, timeout=timeout)
        if stdin:
            chan_in.write(stdin)
        chan_in.channel.shutdown_write()
        # stderr read beside stdout: a command that fills one while we wait on the other
        # would stall on the channel's window.
        errs: list[bytes] = []
        reader = threading.Thread(target=lambda: errs.append(err.read()), daemon=True)
        reader.start()
        o = out.read().decode(errors="replace")
        reader.join()
        e = b"".join(errs).decode(errors="replace")
        return Result(out.channel.recv_exit_status(), o, e)

    def check(self, argv: list[str], stdin: bytes = b"", timeout: float = 600) -> str:
        r = self.run(argv, stdin, timeout)
        if r.status != 0:
            raise RemoteError(
                f"{shlex.join(argv)[:200]} failed ({r.status}): {(r.err or r.out).strip()[-1000:]}"
            )
        return r.out

    def put(self, path: Path, data: bytes | Path, mode: int) -> None:
        """``path`` becomes ``data`` (bytes, or a local file) with ``mode``, owned by root,
        by a rename: never half written."""
        tmp = f"{path.parent}/.{path.name}.bootseer-install"
        if not mode & 0o077 and isinstance(data, bytes):
            # A secret: created 0600 by the shell's umask, never readable by others for a
            # moment (an SFTP file starts with the server's umask: a reader could open it
            # then and keep the descriptor).
            script = (
                'umask 077 && cat > "$1" && chown 0:0 "$1" && chmod "$2" "$1" && mv -f "$1" "$3"'
            )
            self.check(["sh", "-c", script, "-", tmp, f"{mode:o}", str(path)], stdin=data)
            return
        try:
            if isinstance(data, Path):
                self.sftp.put(str(data), tmp, confirm=True)
            else:
                self.sftp.putfo(io.BytesIO(data), tmp, file_size=len(data), confirm=True)
            self.sftp.chmod(tmp, mode)
            self.sftp.chown(tmp, 0, 0)
            self.sftp.posix_rename(tmp, str(path))
        except OSError as exc:
            self._remove(tmp)
            raise RemoteError(f"writing {path}: {describe(exc)}") from None

    def _remove(self, path: str) -> None:
        try:
            if stat.S_ISREG(self.sftp.lstat(path).st_mode or 0):
                self.sftp.remove(path)
        except OSError:
            pass
