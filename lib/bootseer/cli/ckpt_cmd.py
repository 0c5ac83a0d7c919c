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
import pwd
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

from bootseer import units
from bootseer.errors import BootseerError
from bootseer.progress import transfer_bar
from bootseer.units import argparse_age

if TYPE_CHECKING:
    from bootseer.agentapi.ckpt import CkptEntry, UsageRow
    from bootseer.ckpt import Namespace
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


def open_namespace(args: argparse.Namespace, ns: str) -> Namespace:
    from bootseer.ckpt import Namespace, namespace_name
    from bootseer.config import load_config

    me = pwd.getpwuid(os.getuid()).pw_name
    user = args.user or me
    if user != me and os.getuid() != 0:
        raise BootseerError("--user is for root only")
    from bootseer.sitekey import keys_if_root

    cfg = load_config()
    # A user has no site key: what the CLI commits is unsealed, so job mounts will not
    # serve it, and what it reads is not checked (docs/security.md). Root seals and checks.
    return Namespace.from_config(cfg, namespace_name(user, ns), keys=keys_if_root(cfg))


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


def _copy(src: Any, dst: Any, tick: Callable[[int], None]) -> int:
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    total = 0
    while True:
        n = src.readinto(buf)
        if not n:
            return total
        dst.write(view[:n])
        total += n
        tick(n)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except OSError as exc:  # a missing file, a damaged unit: the message names it
        print(f"bootseer ckpt: {exc.strerror or exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    action = args.ckpt_command
    if os.geteuid() != 0:
        if args.user:
            raise BootseerError("--user is for root only")
        if action == "gc":
            from bootseer.cli.caller import require_root

            require_root("ckpt gc", "it deletes units no manifest names")
        from bootseer.cli import ckpt_door

        return ckpt_door.run(args)
    if action == "usage":
        return _usage(args)
    if action == "gc":
        ns = open_namespace(args, args.namespace)
        print(f"{ns.gc(args.min_age)} orphaned versions removed")
        return 0
    name, path = split_remote(
        args.remote if action != "rm" else args.remote[0], need_path=action in ("put", "get", "rm")
    )
    ns = open_namespace(args, name)
    if action == "put":
        src: Any = sys.stdin.buffer if args.local == "-" else open(args.local, "rb")  # noqa: SIM115
        size = None if args.local == "-" else os.fstat(src.fileno()).st_size
        t0 = time.monotonic()
        with src, progress(args, f"put {path}", size) as tick, ns.open(path, "wb") as out:
            n = _copy(src, out, tick)
        _rate("put", n, t0)
        return 0
    if action == "get":
        t0 = time.monotonic()
        with ns.open(path) as f, progress(args, f"get {path}", f.size) as tick:
            if args.local == "-":
                n = _copy(f, sys.stdout.buffer, tick)
            else:
                with part_file(args.local) as out:
                    n = _copy(f, out, tick)
        _rate("get", n, t0)
        return 0
    if action == "ls":
        return _ls(ns, path, remote=args.remote)
    if action == "rm":
        for remote in args.remote:
            n2, p2 = split_remote(remote, need_path=True)
            (ns if n2 == name else open_namespace(args, n2)).remove(p2)
        return 0
    if action == "verify":
        paths = [path] if path and not ns.is_dir(path) else list(ns.walk(path))
        problems: list[str] = []
        total = sum((m.size for m in map(ns.manifest, paths) if m is not None), 0)
        with progress(args, "verify", total) as tick:
            for p in paths:
                problems += ns.verify_file(p, tick)
        for line in problems:
            print(line, file=sys.stderr)
        print(f"{len(paths)} files, {units.iec(total)} checked, {len(problems)} problems")
        return 1 if problems else 0
    raise AssertionError(action)


def _ls(ns: Namespace, path: str, remote: str) -> int:
    from bootseer.ckpt.listing import check_found, list_path

    entries = list_path(ns, path)[0]
    check_found(remote, path, entries)
    print_ls(entries)
    return 0


def _usage(args: argparse.Namespace) -> int:
    from bootseer.ckpt.quota import usage
    from bootseer.config import load_config

    cfg = load_config()
    user = args.user or pwd.getpwuid(os.getuid()).pw_name
    rows = usage(cfg, [cfg.store.open_uri(u) for u in cfg.ckpt.targets], user)
    print_usage(rows)
    return 0


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
