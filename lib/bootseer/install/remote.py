"""One SSH connection to a node (paramiko): run a command, read and write files.

Host names, users, ports and identities come from an OpenSSH client config
(``--ssh-config``, default ``~/.ssh/config``), as ``ssh`` would read them; host keys
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

import paramiko

from bootseer.errors import BootseerError, describe

DEFAULT_SSH_CONFIG = Path("~/.ssh/config").expanduser()


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
        host = cfg.lookup(name)
        self.client = paramiko.SSHClient()
        self.client.load_system_host_keys()
        for known in host.get("userknownhostsfile", "").split():
            known = os.path.expanduser(known)
            if os.path.exists(known):
                self.client.load_host_keys(known)
        self.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            self.client.connect(
                host.get("hostname", name),
                port=int(host.get("port", 22)),
                username=host.get("user", "root"),
                key_filename=[os.path.expanduser(k) for k in host.get("identityfile", [])] or None,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
            )
        except paramiko.SSHException as exc:
            raise RemoteError(f"ssh: {describe(exc)} (is its host key in known_hosts?)") from None
        except OSError as exc:
            raise RemoteError(f"ssh: {exc.strerror or exc}") from None
        self.sftp = self.client.open_sftp()

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sftp.close()
        self.client.close()

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
