"""What ``bootseer ckpt`` does to a namespace: put, get, ls, rm, verify, usage, once.

Root's CLI calls these directly; a user's goes through the node agent's checkpoint
door (:mod:`bootseer.ckpt.door`), which calls the same functions in her namespaces
(:mod:`bootseer.ckpt.access` picks the way). File contents move through a descriptor:
the caller's own file, or a pipe. ``watch``, where given, is the connection of the
caller the work is done for: the descriptor is polled together with it, so a caller
that goes away, or a descriptor that stays silent for :data:`IDLE_SECONDS`, ends the
transfer (a ``put`` then keeps the previous version).
"""

from __future__ import annotations

import errno
import os
import select
import socket
from collections.abc import Callable
from dataclasses import asdict

from bootseer.agentapi.ckpt import (
    CkptGetReply,
    CkptListReply,
    CkptPutReply,
    CkptRemoveReply,
    CkptUsageReply,
    CkptVerifyReply,
    UsageRow,
)
from bootseer.ckpt.errors import CkptError, CkptIOError
from bootseer.ckpt.manifest import Symlink
from bootseer.ckpt.names import check_path
from bootseer.ckpt.namespace import Namespace
from bootseer.ckpt.reader import StripedReader
from bootseer.config import SiteConfig
from bootseer.errors import StoreError, describe

CHUNK = 8 << 20
PIPE_CHUNK = 4096  # at most PIPE_BUF after POLLOUT: a write to a pipe never blocks
IDLE_SECONDS = 300.0

Tick = Callable[[int], None]


class TransferAbandoned(CkptError):
    """The caller went away, or its descriptor moved no data for :data:`IDLE_SECONDS`."""


class BadDescriptor(CkptError):
    """The descriptor cannot be written (closed, or not open for writing)."""


def put(ns: Namespace, path: str, fd: int, watch: socket.socket | None = None) -> CkptPutReply:
    """Read ``fd`` to its end and commit it as ``path``'s new version."""
    check_path(path)
    with ns.open(path, "wb") as out:
        n = _pump(fd, out.write, watch)
        m = out.commit()
    return CkptPutReply(n, m.version, m.unit_count)


def get(ns: Namespace, path: str, fd: int, watch: socket.socket | None = None) -> CkptGetReply:
    """Write ``path``'s current version into ``fd``, from its offset on."""
    with ns.open(path) as f:
        n = _send(f, fd, watch)
        return CkptGetReply(n, f.manifest.version)


def ls(ns: Namespace, path: str, limit: int | None = None) -> CkptListReply:
    """A directory's entries, at most ``limit`` (None: all); ENOENT: nothing there."""
    from bootseer.ckpt.listing import list_path

    if path:
        check_path(path)
    found, more = list_path(ns, path, limit)
    return CkptListReply(found, more)


def rm(ns: Namespace, paths: tuple[str, ...]) -> CkptRemoveReply:
    for path in paths:
        ns.remove(check_path(path))
    return CkptRemoveReply(len(paths))


def verify(
    ns: Namespace, path: str, limit: int | None = None, tick: Tick | None = None
) -> CkptVerifyReply:
    """Read every unit of ``path`` (a file, or every file below a directory) and check
    its checksum; the problems found, at most ``limit`` of them (None: all)."""
    paths = [path] if path and not ns.is_dir(path) else list(ns.walk(path))
    manifests = {}
    problems: list[str] = []
    for p in paths:
        try:
            node = ns.node(p)
        except CkptIOError as exc:  # a manifest that does not verify is a problem
            problems.append(str(exc))
            continue
        if not isinstance(node, Symlink):  # a link holds no units to check
            manifests[p] = node
    total = sum(m.size for m in manifests.values() if m is not None)
    for p in manifests:
        try:
            problems += ns.verify_file(p, tick)
        except CkptIOError as exc:
            problems.append(str(exc))
    shown = problems if limit is None else problems[:limit]
    return CkptVerifyReply(len(paths), total, shown, len(problems) - len(shown))


def usage(cfg: SiteConfig, user: str) -> CkptUsageReply:
    """``user``'s stored bytes on the targets, per quota scope (``[ckpt] quota``)."""
    from bootseer.ckpt.quota import usage as scope_usage

    stores = []
    for uri in cfg.ckpt.targets:
        try:
            stores.append(cfg.store.open_uri(uri))
        except StoreError as exc:
            raise CkptError(f"checkpoint target {uri} is not reachable: {describe(exc)}") from None
    return CkptUsageReply([UsageRow(**asdict(u)) for u in scope_usage(cfg, stores, user)])


# -- moving bytes through a descriptor --------------------------------------------


def _wait(fd: int, event: int, watch: socket.socket | None) -> None:
    """Until ``fd`` is ready for ``event``; the caller gone or silent ends the transfer."""
    p = select.poll()
    p.register(fd, event)
    if watch is not None:
        p.register(watch, select.POLLIN | select.POLLRDHUP)
    ready = dict(p.poll(IDLE_SECONDS * 1000))
    if not ready:
        raise TransferAbandoned(f"no data moved for {IDLE_SECONDS:g}s: request abandoned")
    if watch is not None and watch.fileno() in ready:
        # The client sends nothing after its request: readable means it went away.
        raise TransferAbandoned("the client went away: request abandoned")


def _pump(fd: int, write: Callable[[memoryview], object], watch: socket.socket | None) -> int:
    """Copy ``fd`` to ``write`` until its end; the bytes copied."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    total = 0
    while True:
        _wait(fd, select.POLLIN, watch)
        try:
            n = os.readv(fd, [buf])
        except BlockingIOError:
            continue
        if not n:
            return total
        write(view[:n])
        total += n


def _send(reader: StripedReader, fd: int, watch: socket.socket | None) -> int:
    """Write the reader's bytes into ``fd``; the bytes written."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    total = 0
    # A pipe or socket takes what fits after POLLOUT (PIPE_CHUNK: never blocking the
    # agent); a file of root's own ``ckpt get``, whole chunks.
    step = PIPE_CHUNK if watch is not None else CHUNK
    while True:
        n = reader.readinto(buf)
        if not n:
            return total
        chunk = view[:n]
        while chunk:
            _wait(fd, select.POLLOUT, watch)
            try:
                w = os.write(fd, chunk[:step])
            except BlockingIOError:
                continue
            except BrokenPipeError:
                raise TransferAbandoned("the reader of the output went away") from None
            except OSError as exc:
                if exc.errno in (errno.EBADF, errno.EINVAL):
                    raise BadDescriptor(f"cannot write the descriptor: {exc.strerror}") from None
                raise
            chunk = chunk[w:]
            total += w
