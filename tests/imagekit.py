"""Helpers for the image tests: real squashfs images, and node agents run as processes.

Every agent started here is stopped (by its pid) and its mount detached in a
``finally``, whatever the test did.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import random
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bootseer import mounts
from bootseer.agentapi.client import AgentClient
from bootseer.agentapi.errors import AgentUnavailable
from bootseer.config import SiteConfig
from tests.conftest import squash, to_toml
from tests.sitekeys import key_file


def make_squashfs(dest: Path, files: dict[str, int], seed: int = 1) -> Path:
    """A squashfs image at ``dest`` holding pseudo-random files of the given sizes."""
    src = dest.parent / (dest.name + ".src")
    rng = random.Random(seed)
    for name, size in files.items():
        p = src / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(size))
    return squash(src, dest)


def resident_bytes(path: Path, offset: int = 0, length: int | None = None) -> int:
    """Bytes of ``path``'s range that are in the page cache (``mincore`` of a private
    mapping, which reads nothing itself)."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = os.stat(path).st_size
    length = size - offset if length is None else length
    if length <= 0:
        return 0
    page = mmap.PAGESIZE
    start = offset - offset % page
    span = offset + length - start
    pages = -(-span // page)
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as f:
        m = mmap.mmap(
            f.fileno(),
            span,
            flags=mmap.MAP_PRIVATE,
            prot=mmap.PROT_READ | mmap.PROT_WRITE,
            offset=start,
        )
        try:
            addr = ctypes.c_char.from_buffer(m)
            try:
                if libc.mincore(ctypes.byref(addr), ctypes.c_size_t(span), vec) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore {path}")
            finally:
                del addr
        finally:
            m.close()
    return sum(page for v in vec if v & 1)


def site_config(base: Path, node: str = "t1", **image: Any) -> dict[str, dict[str, Any]]:
    keyfile = base / "site.key"
    (base / "store").mkdir(parents=True, exist_ok=True)  # bootseer never makes a store's root
    return {
        "site": {"key_file": str(keyfile if keyfile.exists() else key_file(base))},
        "store": {"uri": f"file://{base}/store"},
        "paths": {
            "run_dir": f"{base}/%n/run",
            "cache_dir": f"{base}/%n/cache",
            "log_dir": f"{base}/log",
        },
        "image": {
            "socket": f"{base}/%n/agent.sock",
            "mount_dir": f"{base}/%n/mnt",
            "cache_dir": f"{base}/%n/cache/image",
            "block_size_kib": 64,
            "fetch_timeout": 5.0,
            "hot_start_fraction": 1.0,
            **image,
        },
    }


def node_config(base: Path, node: str = "t1", **image: Any) -> SiteConfig:
    """:func:`site_config` as the agent and the hooks on ``node`` load it (``%n`` resolved)."""
    return SiteConfig.from_mapping(site_config(base, **image)).for_node(node)


class AgentProc:
    """One ``bootseer agent`` process with its own config, socket, cache and mount."""

    def __init__(self, base: Path, node: str, config: dict[str, dict[str, Any]]) -> None:
        self.base = base
        self.node = node
        self.config_path = base / f"{node}.toml"
        self.config_path.write_text(to_toml(config))
        self.env = {**os.environ, "BOOTSEER_CONFIG": str(self.config_path)}
        self.socket = Path(config["image"]["socket"].replace("%n", node))
        self.mount = Path(config["image"]["mount_dir"].replace("%n", node))
        self.cache = Path(config["image"]["cache_dir"].replace("%n", node))
        self.log = base / "log" / f"{node}-agent.log"
        self.client = AgentClient(self.socket)
        self.proc: subprocess.Popen[bytes] | None = None
        self.wrap: list[str] = []  # a command the agent runs under (setpriv ...)

    def start(self, timeout: float = 60) -> AgentProc:
        """Start the agent and return once it says it is ready (``READY=1`` on
        ``NOTIFY_SOCKET``, as systemd hears it: its socket answers and its threads are
        up); a test that set its own ``NOTIFY_SOCKET`` hears that itself, and here the
        agent's socket is polled instead."""
        cmd = [sys.executable, "-c", "import sys; from bootseer.cli import main; sys.exit(main())"]
        err = self.base / f"{self.node}-agent.err"
        own_notify = "NOTIFY_SOCKET" not in self.env
        with contextlib.ExitStack() as stack:
            env = self.env
            if own_notify:
                ready = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM))
                name = f"bootseer-test-agent-{os.getpid()}-{id(self)}"
                ready.bind("\0" + name)
                env = {**self.env, "NOTIFY_SOCKET": "@" + name}
            self.proc = subprocess.Popen(
                [*self.wrap, *cmd, "agent", "--node", self.node],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=open(err, "ab"),  # noqa: SIM115
            )
            if own_notify:
                exited = os.pidfd_open(self.proc.pid)  # readable once the agent exits
                stack.callback(os.close, exited)
                got, _, _ = select.select([ready.fileno(), exited], [], [], timeout)
                if ready.fileno() in got and ready.recv(64) == b"READY=1":
                    return self
            else:
                deadline = time.monotonic() + timeout
                while self.proc.poll() is None and time.monotonic() < deadline:
                    try:  # an agent still starting on a busy machine may answer late
                        self.client.call("ping", timeout=max(1.0, deadline - time.monotonic()))
                        return self
                    except AgentUnavailable:
                        time.sleep(0.1)
        if self.proc.poll() is not None:
            raise RuntimeError(f"agent exited: {err.read_text()}")
        raise TimeoutError(f"agent not ready within {timeout:g}s: {err.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        detach(self.mount)

    def kill(self) -> None:
        """A crash: SIGKILL, no cleanup by the agent."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def stats(self) -> dict[str, Any]:
        return self.client.call("stats")

    def prepare(
        self, job_id: int, image: str, uid: int = 0, gid: int = 0, **kw: Any
    ) -> dict[str, Any]:
        return self.client.call(
            "prepare", timeout=60, job_id=job_id, uid=uid, gid=gid, image=image, deadline=30, **kw
        )

    def release(self, job_id: int) -> dict[str, Any]:
        return self.client.call("release", timeout=30, job_id=job_id)

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""


def detach(mount: Path) -> None:
    if mounts.is_mounted(mount):
        mounts.umount(mount, lazy=True)


@contextmanager
def running_agent(base: Path, node: str = "t1", **image: Any) -> Iterator[AgentProc]:
    agent = AgentProc(base, node, site_config(base, node, **image))
    try:
        yield agent.start()
    finally:
        agent.stop()


def add_image(base: Path, path: Path, name: str, block_size_kib: int = 64, *more: str) -> str:
    """``bootseer image add`` (with ``more`` arguments) into the test store; returns the
    image id."""
    cfg = base / "add.toml"
    cfg.write_text(to_toml(site_config(base)))
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from bootseer.cli import main; sys.exit(main())",
            "image",
            "add",
            str(path),
            "--name",
            name,
            "--block-size-kib",
            str(block_size_kib),
            *more,
        ],
        env={**os.environ, "BOOTSEER_CONFIG": str(cfg)},
        capture_output=True,
        text=True,
        check=True,
    )
    return r.stdout.split("image ", 1)[1].split()[0]


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())
