"""``bootseer ckpt`` as a user: each action through the node agent's checkpoint door.

A user holds no store credentials (docs/security.md, "The checkpoint door"): the agent
(root) does the work in the caller's own namespaces. A ``put`` passes the local
file's descriptor, opened here with the user's own rights, and the agent reads it; a
``get`` passes a pipe the agent writes into, and this process writes the file (root's
writes would pass the user's quota). The progress bar follows the file's offset.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import sys
import threading
import time
from collections.abc import Iterator

from bootseer import units
from bootseer.agentapi.ckpt import (
    CkptGet,
    CkptGetReply,
    CkptList,
    CkptPut,
    CkptRemove,
    CkptUsage,
    CkptVerify,
)
from bootseer.agentapi.client import AgentClient
from bootseer.agentapi.errors import AgentUnavailable
from bootseer.errors import BootseerError
from bootseer.progress import Tick, transfer_bar


def door() -> AgentClient:
    from bootseer.config import load_config
    from bootseer.nodepaths import NodePaths, node_name

    return AgentClient(NodePaths(load_config().for_node(node_name())).agent_socket)


def run(args: argparse.Namespace) -> int:
    from bootseer.cli.ckpt_cmd import split_remote

    client = door()
    action = args.ckpt_command
    try:
        if action == "rm":
            by_ns: dict[str, list[str]] = {}
            for remote in args.remote:
                ns, path = split_remote(remote, need_path=True)
                by_ns.setdefault(ns, []).append(path)
            for ns, paths in by_ns.items():
                client.ask(CkptRemove(ns, tuple(paths)))
            return 0
        if action == "usage":
            from bootseer.cli.ckpt_cmd import print_usage

            print_usage(client.ask(CkptUsage()).scopes)
            return 0
        ns, path = split_remote(args.remote, need_path=action in ("put", "get"))
        if action == "put":
            return _put(args, client, ns, path)
        if action == "get":
            return _get(args, client, ns, path)
        if action == "ls":
            from bootseer.ckpt.listing import check_found
            from bootseer.cli.ckpt_cmd import print_ls

            listing = client.ask(CkptList(ns, path))
            check_found(args.remote, path, listing.entries)
            print_ls(listing.entries)
            if listing.left_out:
                print(f"... and {listing.left_out} more entries", file=sys.stderr)
            return 0
        if action == "verify":
            v = client.ask(CkptVerify(ns, path))
            for line in v.problems:
                print(line, file=sys.stderr)
            if v.more_problems:
                print(f"... and {v.more_problems} more problems", file=sys.stderr)
            n = len(v.problems) + v.more_problems
            print(f"{v.files} files, {units.iec(v.bytes)} checked, {n} problems")
            return 1 if n else 0
    except AgentUnavailable as exc:
        raise BootseerError(
            f"{exc}; as a user, `bootseer ckpt` goes through the node agent (users hold no "
            "store credentials): run it on a node where the agent runs (in a job: srun "
            "bootseer ckpt ...), or as root"
        ) from None
    raise AssertionError(action)


def _put(args: argparse.Namespace, client: AgentClient, ns: str, path: str) -> int:
    from bootseer.cli.ckpt_cmd import _rate

    t0 = time.monotonic()
    if args.local == "-":
        fd = sys.stdin.buffer.fileno()
        reply = client.ask(CkptPut(ns, path), fds=[fd])
    else:
        with open(args.local, "rb") as src:
            size = os.fstat(src.fileno()).st_size
            with _following(args, f"put {path}", size, src.fileno()):
                reply = client.ask(CkptPut(ns, path), fds=[src.fileno()])
    _rate("put", reply.bytes, t0)
    return 0


def _get(args: argparse.Namespace, client: AgentClient, ns: str, path: str) -> int:
    from bootseer.cli.ckpt_cmd import _rate

    t0 = time.monotonic()
    if args.local == "-":
        sys.stdout.flush()
        reply = _get_into(client, CkptGet(ns, path), sys.stdout.buffer.fileno(), "stdout")
    else:
        from bootseer.cli.ckpt_cmd import part_file

        with part_file(args.local) as out, _following(args, f"get {path}", None, out.fileno()):
            reply = _get_into(client, CkptGet(ns, path), out.fileno(), args.local)
    _rate("get", reply.bytes, t0)
    return 0


def _get_into(client: AgentClient, req: CkptGet, out: int, name: str) -> CkptGetReply:
    """The agent (root) writes the checkpoint into a pipe; this process, the user's,
    copies it into ``out``: the user's disk quota holds, and so does the reserve a
    filesystem keeps for root (the agent refuses to write a user's file itself)."""
    r, w = os.pipe()
    with contextlib.suppress(OSError):
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
    failed: list[OSError] = []

    def copy() -> None:
        try:
            while chunk := os.read(r, 1 << 20):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view) :]
        except OSError as exc:
            failed.append(exc)
        finally:
            os.close(r)  # the agent's next write then fails (EPIPE) and it gives up

    t = threading.Thread(target=copy, daemon=True)
    t.start()
    reply: CkptGetReply | None = None
    try:
        try:
            reply = client.ask(req, fds=[w])
        finally:
            os.close(w)
            t.join()
    except BootseerError:
        if not failed:
            raise
    if failed or reply is None:
        raise BootseerError(f"writing {name}: {failed[0].strerror or failed[0]}")
    return reply


@contextlib.contextmanager
def _following(args: argparse.Namespace, what: str, total: int | None, fd: int) -> Iterator[None]:
    """A progress bar that follows ``fd``'s offset (the agent reads or writes through it)."""
    stop = threading.Event()
    with transfer_bar(what, total, quiet=args.quiet) as tick:
        t = threading.Thread(target=_follow, args=(fd, tick, stop), daemon=True)
        t.start()
        try:
            yield
        finally:
            stop.set()
            t.join()


def _follow(fd: int, tick: Tick, stop: threading.Event) -> None:
    while not stop.wait(0.2):
        with contextlib.suppress(OSError):
            tick(0, os.lseek(fd, 0, os.SEEK_CUR))
