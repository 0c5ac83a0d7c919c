"""``bootseer ckpt put|get|ls|rm|verify|usage|gc``: striped checkpoint files by hand.

Files are named ``NAMESPACE:PATH`` in the caller's own namespaces (root may pass
``--user``). Root reads and writes the targets itself; a user holds no store
credentials, so a user's command goes through the node agent's checkpoint door
(:mod:`bootseer.ckpt.door`), which knows the caller by ``SO_PEERCRED``. ``gc`` is an
admin's (root only)::

    bootseer ckpt put model.pt llama-25b:step100/model.pt
    bootseer ckpt ls llama-25b:step100
    bootseer ckpt get llama-25b:step100/model.pt /tmp/model.pt
    bootseer ckpt verify llama-25b
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

from bootseer import units
from bootseer.errors import BootseerError
from bootseer.progress import Tick, transfer_bar
from bootseer.units import argparse_age

if TYPE_CHECKING:
    from bootseer.agentapi.ckpt import CkptEntry, UsageRow
    from bootseer.ckpt.quota import ScopeUsage

CHUNK = 8 << 20


def register(sub: Any) -> None:
    p = sub.add_parser(
        "ckpt", help="striped checkpoint storage: put, get, ls, rm, verify, usage, gc"
    )
    p.add_argument("--user", help="act on this user's namespaces (root only)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    cmds = p.add_subparsers(dest="ckpt_command", required=True, metavar="ACTION")
    c = cmds.add_parser("put", help="upload a local file (or - for stdin) as a new version")
    c.add_argument("local")
    c.add_argument("remote", metavar="NAMESPACE:PATH")
    c = cmds.add_parser("get", help="download a file (to - for stdout)")
    c.add_argument("remote", metavar="NAMESPACE:PATH")
    c.add_argument("local")
    c = cmds.add_parser("ls", help="list a directory of a namespace")
    c.add_argument("remote", metavar="NAMESPACE[:DIR]")
    c = cmds.add_parser("rm", help="remove a file (its manifest, then its units)")
    c.add_argument("remote", metavar="NAMESPACE:PATH", nargs="+")
    c = cmds.add_parser("verify", help="read every unit and check its checksum")
    c.add_argument("remote", metavar="NAMESPACE[:PATH]")
    cmds.add_parser("usage", help="your stored bytes on the targets and your quota")
    c = cmds.add_parser("gc", help="delete units no manifest names (left by crashed writers)")
    c.add_argument("namespace")
    c.add_argument(
        "--min-age",
        type=argparse_age,
        default=3600.0,
        metavar="AGE",
        help="only versions older than AGE (default 1h)",
    )
    p.set_defaults(handler=run)


def split_remote(remote: str, need_path: bool) -> tuple[str, str]:
    ns, _, path = remote.partition(":")
    if need_path and not path:
        raise BootseerError(f"{remote!r}: want NAMESPACE:PATH")
    return ns, path


def progress(args: argparse.Namespace, what: str, total: int | None) -> Any:
    return transfer_bar(what, total, quiet=args.quiet)


@contextlib.contextmanager
def part_file(local: str) -> Iterator[BinaryIO]:
    """A new file beside ``local`` that becomes it once whole (a rename), or goes.

    Made by ``mkstemp`` (``O_EXCL``, a random name), never through a link: the fixed
    name ``local + ".part"`` was opened as it was, so in a directory others can write
    (``/tmp/model.pt``, as the examples say) a link planted there made root's ``ckpt
    get`` write the checkpoint into any file it pointed to. The mode is the usual one
    (0666 less the umask).
    """
    d, base = os.path.split(os.path.abspath(local))
    fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".part", dir=d)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as out:
            fd = -1
            yield out
        os.replace(tmp, local)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def run(args: argparse.Namespace) -> int:
    from bootseer.agentapi.errors import AgentUnavailable
    from bootseer.cli.caller import through_agent_hint

    try:
        return _run(args)
    except AgentUnavailable as exc:
        raise through_agent_hint("ckpt", "users hold no store credentials", exc) from None
    except OSError as exc:  # a missing file, a damaged unit: the message names it
        print(f"bootseer ckpt: {exc.strerror or exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    from bootseer.ckpt.access import access
    from bootseer.config import load_config
    from bootseer.nodepaths import node_name

    action = args.ckpt_command
    if action == "gc":
        return _gc(args)
    cfg = load_config()
    if not cfg.ckpt.targets:  # no quota to show, nothing stored: the site has no storage
        where = f" in {cfg.source}" if cfg.source else ""
        print(
            f"bootseer ckpt: this site has no checkpoint storage ([ckpt] targets is empty"
            f"{where}): nothing is stored, there is no quota, --bootseer-ckpt is refused",
            file=sys.stderr,
        )
        return 1
    if os.geteuid() != 0:
        cfg = cfg.for_node(node_name())  # where this node's agent listens
    door = access(cfg, args.user)
    if action == "usage":
        print_usage(door.usage().scopes)
        return 0
    if action == "rm":
        by_ns: dict[str, list[str]] = {}
        for remote in args.remote:
            ns, path = split_remote(remote, need_path=True)
            by_ns.setdefault(ns, []).append(path)
        for ns, paths in by_ns.items():
            door.rm(ns, tuple(paths))
        return 0
    ns, path = split_remote(args.remote, need_path=action in ("put", "get"))
    if action == "put":
        t0 = time.monotonic()
        if args.local == "-":
            reply = door.put(ns, path, sys.stdin.buffer.fileno())
        else:
            with open(args.local, "rb") as src:
                size = os.fstat(src.fileno()).st_size
                with _following(args, f"put {path}", size, src.fileno()):
                    reply = door.put(ns, path, src.fileno())
        _rate("put", reply.bytes, t0)
        return 0
    if action == "get":
        t0 = time.monotonic()
        if args.local == "-":
            sys.stdout.flush()
            got = door.get(ns, path, sys.stdout.buffer.fileno())
        else:
            with part_file(args.local) as out, _following(args, f"get {path}", None, out.fileno()):
                got = door.get(ns, path, out.fileno())
        _rate("get", got.bytes, t0)
        return 0
    if action == "ls":
        from bootseer.ckpt.listing import check_found

        listing = door.ls(ns, path)
        check_found(args.remote, path, listing.entries)
        print_ls(listing.entries)
        if listing.left_out:
            print(f"... and {listing.left_out} more entries", file=sys.stderr)
        return 0
    if action == "verify":
        with progress(args, "verify", None) as tick:
            v = door.verify(ns, path, tick)
        for line in v.problems:
            print(line, file=sys.stderr)
        if v.more_problems:
            print(f"... and {v.more_problems} more problems", file=sys.stderr)
        n = len(v.problems) + v.more_problems
        print(f"{v.files} files, {units.iec(v.bytes)} checked, {n} problems")
        return 1 if n else 0
    raise AssertionError(action)


def _gc(args: argparse.Namespace) -> int:
    from bootseer.ckpt.access import Direct
    from bootseer.cli.caller import require_root, user_name
    from bootseer.config import load_config

    require_root("ckpt gc", "it deletes units no manifest names")
    ns = Direct(load_config(), args.user or user_name()).namespace(args.namespace)
    print(f"{ns.gc(args.min_age)} orphaned versions removed")
    return 0


@contextlib.contextmanager
def _following(args: argparse.Namespace, what: str, total: int | None, fd: int) -> Iterator[None]:
    """A progress bar that follows ``fd``'s offset (whoever reads or writes through it:
    this process as root, or the agent for a user)."""
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


def print_usage(scopes: Sequence[ScopeUsage | UsageRow]) -> None:
    """One row per quota scope: who, stored bytes, the quota, the room left."""
    from bootseer.cli.listing import print_table

    rows = []
    for s in scopes:
        used, limit = s.used, s.limit
        rows.append(
            [
                f"{s.kind} {s.name}",
                units.iec(used),
                units.iec(limit) if limit else "none",
                units.iec(max(0, limit - used)) if limit else "-",
            ]
        )
    print_table(["WHO", "STORED", "QUOTA", "FREE"], rows, right={1, 2, 3})


def print_ls(entries: list[CkptEntry]) -> None:
    """One row per file or directory: size, age, version, units, name (the name last,
    whole in a file, shortened from the left only on a narrow terminal)."""
    from bootseer.cli.listing import print_table

    now = time.time()
    rows = [
        ["dir", "", "", "", f"{e.name}/"]
        if e.is_dir
        else [units.iec(e.size), f"{units.age(now - e.mtime)} ago", e.version, str(e.units), e.name]
        for e in entries
    ]
    print_table(["SIZE", "MODIFIED", "VERSION", "UNITS", "NAME"], rows, right={0, 1, 2, 3})


def _rate(what: str, n: int, t0: float) -> None:
    secs = max(time.monotonic() - t0, 1e-9)
    print(f"{what}: {units.iec(n)} in {secs:.2f} s ({units.iec(n / secs)}/s)", file=sys.stderr)
