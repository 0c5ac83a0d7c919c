"""The node agent: prepares images for jobs, serves them lazily, records and prefetches.

One agent runs per node (``bootseer agent``; packaging/bootseer-agent.service). It
holds the block cache and the fetcher, exposes each prepared job's image as
``<mount_dir>/<job_id>.sqsh`` through FUSE (:mod:`bootseer.image.fuse`), and answers
the prolog and epilog on a unix socket, one JSON request per connection::

    {"op": "prepare", "job_id": 42, "uid": 1000, "gid": 1000, "image": "/shared/a.sqsh",
     "mode": "on", "deadline": 80}
    {"op": "first_step", "job_id": 42}
    {"op": "release", "job_id": 42}
    {"op": "status", "job_id": 42}  /  {"op": "ping"}

The caller is known by ``SO_PEERCRED``: root may do anything; any other user may
only ask ``status``/``first_step`` about a job of their own.

    >>> AgentClient(Path("/run/bootseer/agent.sock")).call("ping")
    {'ok': True, 'node': 'n1', 'pid': 4242}
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bootseer.config import SiteConfig
from bootseer.errors import BootseerError, StoreError
from bootseer.image.blocks import block_range, check_block_size
from bootseer.image.cache import BlockCache
from bootseer.image.fetch import DEMAND, BlockSource, Fetcher, FileSource, StoreSource
from bootseer.image.manifest import Manifest, load_manifest
from bootseer.image.prefetch import BackgroundFill, PrefetchResult, prefetch_hot
from bootseer.image.registry import (
    RegistrationPending,
    lookup_name,
    open_image_file,
    register_path,
)
from bootseer.image.trace import Recorder, Trace, load_trace, save_trace
from bootseer.options import parse_image
from bootseer.store import Store

MAX_REQUEST = 64 << 10
INODE_BASE = 16  # job file inode = INODE_BASE + job id; below are the root's


class AgentError(BootseerError):
    """The agent refused or failed a request (the message says why)."""


class AgentUnavailable(AgentError):
    """No agent answers on the socket."""


@dataclass(eq=False)
class PreparedImage:
    manifest: Manifest
    source: BlockSource
    ref: str
    users: int = 0
    fill: BackgroundFill | None = None

    @property
    def id(self) -> str:
        return self.manifest.id


@dataclass(eq=False)
class JobView:
    job_id: int
    uid: int
    gid: int
    image: PreparedImage
    recorder: Recorder
    refresh: bool = False
    prepared_at: float = field(default_factory=time.time)
    first_step_at: float | None = None
    fetched_at_prepare: int = 0
    fetched_before_first_step: int | None = None
    prefetch: PrefetchResult | None = None
    trace_runs: int = 0

    @property
    def inode(self) -> int:
        return INODE_BASE + self.job_id

    @property
    def name(self) -> str:
        return f"{self.job_id}.sqsh"


def _log_to(path: Path) -> Callable[[str], None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(message: str) -> None:
        now = time.time()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now))
        stamp += f".{int(now % 1 * 1000):03d}"
        os.write(fd, f"{stamp} agent[{os.getpid()}] {message}\n".encode(errors="replace"))

    return log


class Agent:
    """The agent's state and its requests; the socket server and FUSE call into it."""

    def __init__(
        self,
        cfg: SiteConfig,
        node: str,
        log: Callable[[str], None] | None = None,
        store: Store | None = None,
    ) -> None:
        self.cfg = cfg
        self.node = node
        self.icfg = cfg.image
        self.log = log or _log_to(cfg.paths.log_dir / f"{node}-agent.log")
        self.store = store or cfg.store.open()
        self.block_size = check_block_size(self.icfg.block_size_kib << 10)
        self.cache = BlockCache(
            self.icfg.cache_dir, int(self.icfg.cache_size_gib * (1 << 30)), self.log
        )
        self.fetcher = Fetcher(
            self.cache,
            self.icfg.prefetch_parallel,
            self.icfg.background_parallel,
            self.icfg.fetch_timeout,
            self.log,
        )
        self.state_dir = self.icfg.cache_dir / "jobs"
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.jobs: dict[int, JobView] = {}
        self.images: dict[tuple[str, str], PreparedImage] = {}
        self._lock = threading.RLock()
        self._ref_locks: dict[str, threading.Lock] = {}

    # -- requests -----------------------------------------------------------------

    def handle(self, req: Any, peer_uid: int) -> dict[str, Any]:
        if not isinstance(req, dict):
            raise AgentError("request must be a JSON object")
        op = req.get("op")
        if op == "ping":
            return {"ok": True, "node": self.node, "pid": os.getpid()}
        if op == "stats":
            return {"ok": True, **self.stats()}
        job_id = req.get("job_id")
        if not isinstance(job_id, int) or isinstance(job_id, bool) or not 0 < job_id < 2**40:
            raise AgentError("job_id must be a positive whole number")
        if op in ("status", "first_step"):
            view = self._own_job(job_id, peer_uid)
            if op == "first_step":
                self.first_step(view)
            return {"ok": True, **self.describe(view)}
        if peer_uid != 0:
            raise AgentError(f"{op!r} is for root (the prolog/epilog) only")
        if op == "prepare":
            return {"ok": True, **self.prepare(job_id, req)}
        if op == "release":
            return {"ok": True, **self.release(job_id)}
        raise AgentError(f"unknown op {op!r} (ops: ping, prepare, status, first_step, release)")

    def _own_job(self, job_id: int, peer_uid: int) -> JobView:
        with self._lock:
            view = self.jobs.get(job_id)
        if view is None or (peer_uid != 0 and view.uid != peer_uid):
            # The same answer for "not yours" and "not here": no probing others' jobs.
            raise AgentError(f"no prepared image for job {job_id} of uid {peer_uid} on {self.node}")
        return view

    @contextlib.contextmanager
    def _single_flight(self, ref: str) -> Iterator[None]:
        with self._lock:
            lock = self._ref_locks.setdefault(ref, threading.Lock())
        with lock:
            yield

    def prepare(self, job_id: int, req: dict[str, Any]) -> dict[str, Any]:
        t0 = time.monotonic()
        uid, gid, ref = req.get("uid"), req.get("gid"), req.get("image")
        mode = req.get("mode", "on")
        wait = req.get("deadline", 60.0)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (uid, gid)):
            raise AgentError("uid and gid must be whole numbers")
        if not isinstance(ref, str) or mode not in ("on", "refresh"):
            raise AgentError("image must be a string and mode on or refresh")
        if not isinstance(wait, int | float) or wait <= 0:
            raise AgentError("deadline must be a positive number of seconds")
        assert isinstance(uid, int) and isinstance(gid, int)
        parse_image(ref)
        until = t0 + float(wait)
        with self._lock:
            if job_id in self.jobs:
                return self.describe(self.jobs[job_id])  # a retried prolog: same answer
        with self._single_flight(ref):
            manifest, source = self._resolve(ref, uid, gid, until)
            if time.monotonic() >= until:
                raise AgentError(f"image {ref} took longer than the prolog waits to prepare")
            image = self._use_image(manifest, source, ref)
        view = JobView(
            job_id,
            uid,
            gid,
            image,
            Recorder(manifest.nblocks, self.icfg.trace_window),
            refresh=mode == "refresh",
            fetched_at_prepare=self.fetcher.stats.by_image[manifest.id],
        )
        with self._lock:
            self.jobs[job_id] = view
        self._save_job(view)
        trace = None if view.refresh else load_trace(self.store, manifest, self.log)
        view.trace_runs = trace.runs if trace else 0
        hot = trace.blocks if trace else ()
        hot_until = min(time.monotonic() + self.icfg.hot_deadline, until - 0.5)
        view.prefetch = prefetch_hot(
            self.fetcher, source, manifest, hot, hot_until, self.icfg.hot_start_fraction
        )
        if image.fill is None or image.fill.cancelled:
            image.fill = BackgroundFill(manifest.id)
            image.fill.start(self.fetcher, source, manifest, set(hot))
        p = view.prefetch
        self.log(
            f"job={job_id} prepared {ref} ({manifest.id[:12]}, {manifest.size} bytes): "
            f"trace={'none' if trace is None else f'{len(hot)} blocks'} "
            f"local_before={p.local_before} fetched={p.fetched_blocks} "
            f"failed={p.failed} complete={p.complete} secs={time.monotonic() - t0:.3f}"
        )
        return self.describe(view)

    def _resolve(self, ref: str, uid: int, gid: int, until: float) -> tuple[Manifest, BlockSource]:
        if ref.startswith("/"):
            fd, st = open_image_file(ref, uid, gid)
            wait = max(0.0, min(self.icfg.register_wait, until - time.monotonic() - 1.0))
            try:
                manifest = register_path(
                    self.store, ref, st, self.block_size, wait, self.log, f"/proc/self/fd/{fd}"
                )
            except RegistrationPending as exc:
                raise AgentError(f"{exc}; not ready within {wait:.0f}s") from None
            finally:
                os.close(fd)
            return manifest, FileSource(os.path.realpath(ref))
        try:
            return lookup_name(self.store, ref), StoreSource(self.store)
        except StoreError as exc:
            raise AgentError(str(exc)) from None

    def _use_image(self, manifest: Manifest, source: BlockSource, ref: str) -> PreparedImage:
        key = (manifest.id, source.describe())
        with self._lock:
            image = self.images.get(key)
            if image is None:
                image = self.images[key] = PreparedImage(manifest, source, ref)
                self.cache.pin(manifest.blocks)
            image.users += 1
            return image

    def first_step(self, view: JobView) -> None:
        if view.first_step_at is None:
            view.first_step_at = time.time()
            view.recorder.stop()
            view.fetched_before_first_step = (
                self.fetcher.stats.by_image[view.image.id] - view.fetched_at_prepare
            )
            self.log(
                f"job={view.job_id} first step: {len(view.recorder.order)} blocks read "
                f"since prepare, {view.fetched_before_first_step} bytes fetched"
            )

    def release(self, job_id: int) -> dict[str, Any]:
        with self._lock:
            view = self.jobs.pop(job_id, None)
        (self.state_dir / f"{job_id}.json").unlink(missing_ok=True)
        if view is None:
            return {"released": False}
        view.recorder.stop()
        out = self.describe(view)
        out["released"] = True
        try:
            out["trace"] = self._keep_trace(view)
        except StoreError as exc:
            self.log(f"job={job_id} trace not saved: {exc}")
            out["trace"] = f"not saved: {exc}"
        with self._lock:
            image = view.image
            image.users -= 1
            if image.users <= 0:
                self.cache.unpin(image.manifest.blocks)
                if image.fill is not None:
                    image.fill.cancel()
                self.images.pop((image.id, image.source.describe()), None)
        self.log(f"job={job_id} released: trace {out['trace']}")
        return out

    def _keep_trace(self, view: JobView) -> str:
        order = view.recorder.order
        if not order:
            return "none recorded"
        m = view.image.manifest
        stored = None if view.refresh else load_trace(self.store, m, self.log)
        if stored is None:
            new: Trace | None = Trace(m.id, m.nblocks, m.block_size, tuple(order))
            verdict = f"saved ({len(order)} blocks)"
        else:
            new = stored.merged(order)
            verdict = (
                "unchanged"
                if new is None
                else f"merged ({len(new.blocks) - len(stored.blocks)} new blocks)"
            )
        if new is not None:
            save_trace(self.store, new)
        return verdict

    def describe(self, view: JobView) -> dict[str, Any]:
        fill = view.image.fill
        return {
            "job_id": view.job_id,
            "path": str(self.icfg.mount_dir / view.name),
            "image": view.image.id,
            "ref": view.image.ref,
            "size": view.image.manifest.size,
            "block_size": view.image.manifest.block_size,
            "blocks": view.image.manifest.nblocks,
            "trace_runs": view.trace_runs,
            "prefetch": view.prefetch.as_dict() if view.prefetch else None,
            "fill": fill.as_dict() if fill else None,
            "recorded_blocks": len(view.recorder.order),
            "first_step_at": view.first_step_at,
            "fetched_before_first_step": view.fetched_before_first_step,
        }

    def stats(self) -> dict[str, Any]:
        s = self.fetcher.stats
        return {
            "node": self.node,
            "jobs": sorted(self.jobs),
            "cache_bytes": self.cache.bytes,
            "cache_blocks": len(self.cache),
            "cache_cap": self.cache.cap,
            "evicted": self.cache.evicted,
            "fetched_blocks": s.blocks,
            "fetched_bytes": s.bytes,
            "demand_bytes": s.by_priority[0],
            "prefetch_bytes": s.by_priority[1],
            "background_bytes": s.by_priority[2],
            "corrupt_refused": s.corrupt,
            "fetch_errors": s.errors,
        }

    # -- reads (FUSE) ---------------------------------------------------------------

    def read(
        self, view: JobView, offset: int, size: int, cached_only: bool = False
    ) -> bytes | None:
        """Bytes of the job's image; with ``cached_only``, None unless all are local."""
        m = view.image.manifest
        if offset >= m.size or size <= 0:
            return b""
        size = min(size, m.size - offset)
        blocks = block_range(offset, size, m.block_size)
        view.recorder.record(blocks.start, blocks.stop - 1)
        self.fetcher.last_read = time.monotonic()
        if not cached_only and len(blocks) > 1:
            # Ask for every missing block of the request at once: they come in parallel.
            for i in blocks:
                if m.blocks[i] not in self.cache:
                    self.fetcher.request(view.image.source, m, i, DEMAND)
        parts = []
        for i in blocks:
            start = i * m.block_size
            lo = max(offset, start) - start
            hi = min(offset + size, start + m.block_length(i)) - start
            data = self.cache.read(m.blocks[i], lo, hi - lo)
            if data is None:
                if cached_only:
                    return None
                data = self.fetcher.get(view.image.source, m, i)[lo:hi]
            parts.append(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def job_by_inode(self, inode: int) -> JobView | None:
        with self._lock:
            return self.jobs.get(inode - INODE_BASE)

    def job_list(self) -> list[JobView]:
        with self._lock:
            return sorted(self.jobs.values(), key=lambda v: v.job_id)

    # -- restart ------------------------------------------------------------------

    def _save_job(self, view: JobView) -> None:
        doc = {
            "job_id": view.job_id,
            "uid": view.uid,
            "gid": view.gid,
            "ref": view.image.ref,
            "image": view.image.id,
            "refresh": view.refresh,
            "path": view.image.source.path if isinstance(view.image.source, FileSource) else None,
        }
        tmp = self.state_dir / f".{view.job_id}.json.tmp"
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.state_dir / f"{view.job_id}.json")

    def restore(self) -> None:
        """Bring back the jobs prepared before a restart, so their image paths work again."""
        for f in sorted(self.state_dir.glob("*.json")):
            try:
                doc = json.loads(f.read_text())
                manifest = load_manifest(self.store, doc["image"])
                source: BlockSource = (
                    FileSource(doc["path"]) if doc.get("path") else StoreSource(self.store)
                )
                image = self._use_image(manifest, source, doc["ref"])
                view = JobView(
                    int(doc["job_id"]),
                    int(doc["uid"]),
                    int(doc["gid"]),
                    image,
                    Recorder(manifest.nblocks, 0),
                    refresh=bool(doc["refresh"]),
                )
                with self._lock:
                    self.jobs[view.job_id] = view
            except (ValueError, KeyError, TypeError, StoreError) as exc:
                self.log(f"state {f.name} not restored: {exc}")
                f.unlink(missing_ok=True)
        if self.jobs:
            self.log(f"restored {len(self.jobs)} prepared jobs: {sorted(self.jobs)}")

    def close(self) -> None:
        self.fetcher.stop()
        with self._lock:
            for image in self.images.values():
                if image.fill is not None:
                    image.fill.cancel()


# -- the socket -------------------------------------------------------------------


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


class _Handler(socketserver.StreamRequestHandler):
    server: AgentServer
    # The socket is open to every user: an idle connection must not hold a thread forever.
    timeout = 10.0

    def handle(self) -> None:
        uid = peer_uid(self.request)
        line = self.rfile.readline(MAX_REQUEST)
        try:
            resp = self.server.agent.handle(json.loads(line), uid)
        except (ValueError, AgentError, StoreError) as exc:
            resp = {"ok": False, "error": str(exc)}
        except Exception as exc:
            self.server.agent.log(f"request failed: {exc!r}")
            resp = {"ok": False, "error": f"agent error: {exc!r}"}
        with contextlib.suppress(OSError):
            self.wfile.write(json.dumps(resp).encode() + b"\n")


class AgentServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: Path, agent: Agent) -> None:
        self.agent = agent
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        with contextlib.suppress(AgentUnavailable):
            AgentClient(path).call("ping", timeout=2)
            raise AgentError(f"another agent already answers on {path}")
        path.unlink(missing_ok=True)
        super().__init__(str(path), _Handler)
        os.chmod(path, 0o666)  # users may ask about their own jobs; SO_PEERCRED decides


class AgentClient:
    """Talk to the node's agent: one request, one answer."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def call(self, op: str, timeout: float = 10.0, **args: Any) -> dict[str, Any]:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            try:
                s.connect(str(self.path))
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                raise AgentUnavailable(f"no node agent on {self.path}: {exc.strerror}") from None
            s.sendall(json.dumps({"op": op, **args}).encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(1 << 16)
                if not chunk:
                    break
                buf += chunk
        except TimeoutError:
            raise AgentError(
                f"node agent on {self.path}: no answer to {op} within {timeout:g}s"
            ) from None
        except OSError as exc:
            raise AgentUnavailable(f"node agent on {self.path}: {exc}") from None
        finally:
            s.close()
        try:
            resp: dict[str, Any] = json.loads(buf)
        except ValueError:
            raise AgentError(f"node agent on {self.path}: bad answer {buf[:100]!r}") from None
        if not resp.get("ok"):
            raise AgentError(f"node agent: {resp.get('error', 'request failed')}")
        return resp
