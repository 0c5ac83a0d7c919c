"""Warming a job's checkpoint on its nodes while the store link has room.

A job reads its checkpoint after its container has started: the prolog (the image's
hot set, the dependency restore) and the container's start keep the store link busy
only part of the time. At N = 2 the link idled about 8 s of a 47 s start while the
nodes extracted the restore and started the container from their caches, at N = 1
1.5 s of 22 (slurm-dev's startup bench); the checkpoint's units then came at the
link's rate after that, with nothing fetched ahead (docs/performance.md, "Two nodes
against one"). The mount daemon therefore asks the node agent, ahead of the job's
reads, for the namespace's units, the files committed last first (a restart loads the
newest checkpoint) and each file's units in order, a few at a time (:data:`PARALLEL`):
the agent gets each from its owner among the job's nodes or, owning it (always, in a
one-node job), from the target, verifies and caches it, so each unit still leaves the
store once per job, and the job's reads of it later are cache hits. A few units at a
time take a small share of a busy link (the prefetch runs 16 block reads, the restore 8
frames) and all of an idle one.

It starts once the node holds the job's image's hot set (the agent's ``status``: the
prolog's prefetch returned and no hot block is pending), which the container's start
reads first: asked from the mount on, beside the hot set's rest, the warm-up took the
link from it and the container's start waited (N = 2: prolog 19 s, container 11 s,
against 15 and 7). A job with no image here (none asked for, the agent says "not found"
for :data:`NO_IMAGE_WAIT` seconds) starts at once after that. It also waits for the
prolog's end (:func:`prolog_done`): the dependency restore is on the prolog's path, and
once bundles brought the hot set within its first seconds the warm-up ran beside it;
at real sizes on one node (2 cores) the restore then took 7.2-8.2 s against 3.5 s (its
``tar`` in ext4's inode allocation), and the start 17.3-18.5 s against 13.9 s without
the warm-up (docs/performance.md, "The warm-up beside the restore"). No start waits
more than :data:`SETTLE_WAIT`.

At most ``limit`` bytes are warmed (``[ckpt] warm_mib``: a checkpoint larger than the
node's share of it should not fill the node's cache with units it never reads), and
warming stops at the first unit the agent cannot give (the reader will go to the target
itself) or when the mount ends::

    >>> warm = Warm(ns, limit=4 << 30)       # doctest: +SKIP
    >>> warm.start()                         # doctest: +SKIP
    >>> warm.stop()                          # doctest: +SKIP
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bootseer.ckpt.namespace import Namespace
from bootseer.errors import describe

# Units asked of the agent at once: a few, so that a busy link (the restore's 8
# frames, the job's own reads) gives the warm-up a small share of it.
PARALLEL = 2
# Seconds the warm-up waits for the image's hot set at most, and for a job's image to
# be known to the agent at all (the image step runs beside the mount in the prolog).
SETTLE_WAIT = 60.0
NO_IMAGE_WAIT = 20.0
POLL = 0.25


@dataclass
class WarmResult:
    units: int = 0  # units the agent now holds for the job's reads
    bytes: int = 0
    store_bytes: int = 0  # of them: read from the targets by this node's agent
    peer_bytes: int = 0  # and from the job's other nodes
    stopped_by: str = ""  # why it ended before the namespace did ("" if it did not)


@dataclass(frozen=True)
class _Unit:
    uri: str
    key: str
    length: int
    digest: str


class Warm:
    def __init__(
        self,
        ns: Namespace,
        limit: int,
        paths: Callable[[], Iterable[str]] | None = None,
        parallel: int = PARALLEL,
        log: Callable[[str], None] = lambda _: None,
        settled: Callable[[float], bool] | None = None,
    ) -> None:
        """``paths``: the files in the order the job reads them (default: the
        namespace's, the most recently committed first). ``settled(seconds waited)``: whether the
        node's startup reads that come first are done (:func:`image_settled`)."""
        self.settled = settled
        self.ns = ns
        self.limit = limit
        self.paths = paths or (lambda: _newest_first(ns))
        self.parallel = max(1, parallel)
        self.log = log
        self.result = WarmResult()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Warm in a thread of its own (nothing to do without the agent's path)."""
        if self.ns.via is None or self.limit <= 0:
            return
        self._thread = threading.Thread(target=self.run, name="ckpt-warm", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """No more units asked; waits up to ``timeout`` for those in flight."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> WarmResult:
        """Ask the agent for the units in order, ``parallel`` at once, until ``limit``
        bytes, the namespace's end, a unit it cannot give, or :meth:`stop`."""
        res = self.result
        lock = threading.Lock()
        t0 = time.monotonic()
        while self.settled is not None and not self._stop.is_set():
            waited = time.monotonic() - t0
            if waited >= SETTLE_WAIT or self.settled(waited):
                self.log(f"checkpoint warm-up starts after {waited:.1f}s")
                break
            self._stop.wait(POLL)
        with cf.ThreadPoolExecutor(self.parallel, thread_name_prefix="ckpt-warm") as pool:
            inflight: set[cf.Future[None]] = set()
            try:
                for unit in self._units():
                    if self._stop.is_set() or res.stopped_by:
                        res.stopped_by = res.stopped_by or "stopped"
                        break
                    with lock:
                        if res.bytes + unit.length > self.limit:
                            res.stopped_by = "limit"
                            break
                        res.bytes += unit.length  # counted when asked: the limit holds
                    while len(inflight) >= self.parallel:
                        inflight = _wait_one(inflight)
                    inflight.add(pool.submit(self._one, unit, lock))
            except Exception as exc:  # the listing or a manifest: the reads will say
                res.stopped_by = f"error: {describe(exc)}"
            cf.wait(inflight)
        self.log(
            f"checkpoint warm-up: {res.units} units, {res.bytes} bytes (store {res.store_bytes}, "
            f"peers {res.peer_bytes}){'; ended: ' + res.stopped_by if res.stopped_by else ''}"
        )
        return res

    def _one(self, unit: _Unit, lock: threading.Lock) -> None:
        via = self.ns.via
        got = via(unit.uri, unit.key, 0, unit.length, unit.digest) if via else None
        with lock:
            res = self.result
            if got is None:
                res.bytes -= unit.length
                res.stopped_by = res.stopped_by or f"not given: {unit.key}"
                return
            data, source = got
            res.units += 1
            if source == "store":
                res.store_bytes += len(data)
                self.ns.store_bytes += len(data)
            elif source == "peer":
                res.peer_bytes += len(data)
                self.ns.peer_bytes += len(data)
        del data, got  # the via's buffer is used again once no view of it is left

    def _units(self) -> Iterator[_Unit]:
        for path in self.paths():
            m = self.ns.manifest(path)
            if m is None:
                continue
            for i, (unit, digest) in enumerate(m.units):
                length = m.unit_length(i)
                if length:
                    yield _Unit(m.target_of(i), self.ns.unit_key(m.version, unit), length, digest)


def image_settled(socket: Path | str, job_id: int) -> Callable[[float], bool]:
    """Whether the node's agent holds job ``job_id``'s hot set (no hot block pending),
    asked of it; True too when the agent cannot say (an error, or not found after
    :data:`NO_IMAGE_WAIT` seconds: a job without an image)."""
    from bootseer.agentapi.client import AgentClient
    from bootseer.agentapi.errors import AgentError, AgentNotFound
    from bootseer.agentapi.jobs import Status

    client = AgentClient(socket)

    def settled(waited: float) -> bool:
        try:
            reply = client.ask(Status(job_id), timeout=5.0)
        except AgentNotFound:
            return waited >= NO_IMAGE_WAIT
        except (AgentError, OSError):
            return True
        # No prefetch yet: the prolog's image step is still waiting for the hot set's
        # leading part (an agent before ``pending`` says 0 from the prolog's return).
        return reply.prefetch is not None and reply.prefetch.pending <= 0

    return settled


def prolog_done(env: Path) -> Callable[[float], bool]:
    """Whether the job's prolog on this node has ended: it writes the job's ``env`` file
    last (:mod:`bootseer.jobdir`), after every step, the restore's included."""
    return lambda waited: env.exists()


def all_of(*checks: Callable[[float], bool]) -> Callable[[float], bool]:
    """Settled when every one of ``checks`` is (each asked until it is, then no more)."""
    pending = list(checks)

    def settled(waited: float) -> bool:
        pending[:] = [c for c in pending if not c(waited)]
        return not pending

    return settled


def _newest_first(ns: Namespace) -> Iterator[str]:
    """The namespace's files, the most recently committed first (by the listing's mtime
    of each manifest; among equals, the name that sorts last first). A restart loads the
    checkpoint saved last, and a namespace keeps the ones before it beside it
    (``step_1000/``, ``step_2000/``, ...): taken by name, the warm-up would spend its
    limit on the oldest, each read from the targets once per job for nothing. Only the
    listings are read here; a file's manifest is read when its units are asked."""
    files: list[tuple[float, str]] = []
    dirs = [""]
    while dirs:
        path = dirs.pop()
        for e in ns.listdir(path):
            sub = f"{path}/{e.name}" if path else e.name
            if e.is_dir:
                dirs.append(sub)
            else:
                files.append((e.mtime, sub))
    files.sort(reverse=True)
    yield from (path for _, path in files)


def _wait_one(inflight: set[cf.Future[None]]) -> set[cf.Future[None]]:
    """The futures still running once one has ended."""
    _, rest = cf.wait(inflight, return_when=cf.FIRST_COMPLETED)
    return set(rest)
