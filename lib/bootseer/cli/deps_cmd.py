"""``bootseer deps run|key|ls|show|rm|gc``: dependency snapshots.

    bootseer deps run --prefix /tmp/venv --key-file requirements.txt -- \\
        sh -c 'python3 -m venv /tmp/venv && /tmp/venv/bin/pip install -r requirements.txt'
    bootseer deps key --prefix /tmp/venv --key-file requirements.txt
    bootseer deps ls
    bootseer deps gc --unused 30d --max-total 500G --dry-run

Users see their own snapshots (scope ``user/<them>``) and the shared scopes their jobs
restore from, through the node agent (they may not read the store: bootseer.deps.views);
root reads the store and sees all of them (``--all``). Removing snapshots (``rm``,
``gc``) is an admin's: users hold no store credentials.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict
from typing import Any

from bootseer import units
from bootseer.agentapi.views import DepsList, DepsShow
from bootseer.agentapi.wire import R, Request
from bootseer.cli.caller import require_root, user_name
from bootseer.errors import BootseerError
from bootseer.options import SCOPES
from bootseer.units import argparse_age


def register(sub: Any) -> None:
    p = sub.add_parser("deps", help="dependency snapshots: run an install, list, gc")
    dsub = p.add_subparsers(dest="deps_command", required=True, metavar="ACTION")

    def spec_args(q: argparse.ArgumentParser) -> None:
        q.add_argument("--prefix", help="the directory the install fills (absolute)")
        q.add_argument(
            "--key-file",
            action="append",
            default=[],
            metavar="FILE",
            help="a file whose contents decide the snapshot (repeatable)",
        )
        q.add_argument("--scope", choices=SCOPES, default="user")
        q.add_argument("--account", default="", help="for --scope account (default: the job's)")

    r = dsub.add_parser(
        "run",
        help="run an install, or skip it when a snapshot was restored",
        description="Run CMD to fill the prefix; skipped when the prolog (or "
        "this command) restored a snapshot of the same key; otherwise "
        "the result is captured (by the epilog inside a job).",
    )
    spec_args(r)
    r.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD...")
    r.set_defaults(handler=cmd_run)

    k = dsub.add_parser("key", help="print the snapshot key and what went into it")
    spec_args(k)
    k.add_argument(
        "--image",
        help="container image (default: the job's --bootseer-image, from $BOOTSEER_IMAGE_REF)",
    )
    k.add_argument("--json", action="store_true")
    k.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD...")
    k.set_defaults(handler=cmd_key)

    ls = dsub.add_parser("ls", help="list snapshots")
    ls.add_argument("--scope", action="append", help="user/NAME, account/NAME or cluster")
    ls.add_argument("--all", action="store_true", help="every scope (root)")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(handler=cmd_ls)

    sh = dsub.add_parser("show", help="show one snapshot's manifest")
    sh.add_argument("key")
    sh.add_argument("--scope", help="default: your user scope")
    sh.add_argument("--files", action="store_true", help="list every entry")
    sh.set_defaults(handler=cmd_show)

    rm = dsub.add_parser("rm", help="remove snapshots")
    rm.add_argument("keys", nargs="+", metavar="KEY")
    rm.add_argument("--scope", help="default: your user scope")
    rm.set_defaults(handler=cmd_rm)

    gc = dsub.add_parser("gc", help="remove old, unused or excess snapshots")
    gc.add_argument(
        "--max-age",
        type=argparse_age,
        metavar="AGE",
        help="remove snapshots captured longer ago (30d)",
    )
    gc.add_argument(
        "--unused",
        type=argparse_age,
        metavar="AGE",
        help="remove snapshots not restored for AGE (30d)",
    )
    gc.add_argument(
        "--max-total", help="then remove least recently used until under SIZE (500G: GiB)"
    )
    gc.add_argument(
        "--grace",
        type=argparse_age,
        default=6 * 3600.0,
        metavar="AGE",
        help="age before unreferenced archives and refs are swept (default 6h)",
    )
    gc.add_argument("--scope", action="append")
    gc.add_argument("--all", action="store_true", help="every scope (root)")
    gc.add_argument("--dry-run", action="store_true")
    gc.set_defaults(handler=cmd_gc)


def _command(raw: list[str]) -> list[str]:
    return raw[1:] if raw and raw[0] == "--" else raw


def parse_size(text: str) -> int:
    try:
        return units.parse_size(text)
    except units.UnitError as exc:
        raise BootseerError(str(exc)) from None


def _store() -> Any:
    from bootseer.config import load_config

    cfg = load_config()
    return cfg, cfg.store.open()


def _scopes(store: Any, asked: list[str] | None, every: bool) -> list[str]:
    from bootseer.deps.gc import all_scopes

    me = user_name()
    if every:
        if os.geteuid() != 0:
            raise BootseerError("--all is for root; without it you see your own scope")
        return all_scopes(store)
    scopes = asked or [f"user/{me}"]
    for s in scopes:
        if os.geteuid() != 0 and s.startswith("user/") and s != f"user/{me}":
            raise BootseerError(f"scope {s} is another user's")
    return scopes


def cmd_run(args: argparse.Namespace) -> int:
    from bootseer.deps.run import RunOptions, run_install

    return run_install(
        _command(args.cmd),
        RunOptions(
            prefix=args.prefix, key_files=args.key_file, scope=args.scope, account=args.account
        ),
    )


def cmd_key(args: argparse.Namespace) -> int:
    from bootseer.config import load_config
    from bootseer.deps.key import hash_key_files, job_image, key_inputs, scope_dir, snapshot_key
    from bootseer.deps.step import effective_scope

    if not args.prefix:
        raise BootseerError("--prefix is required")
    cfg = load_config()
    scope, note = effective_scope(args.scope, cfg)
    sdir = scope_dir(scope, user_name(), args.account or os.environ.get("SLURM_JOB_ACCOUNT", ""))
    files = hash_key_files(args.key_file, os.getcwd(), cfg.deps.max_key_file_bytes)
    inputs = key_inputs(
        scope=sdir,
        prefix=args.prefix,
        key_files=files,
        image=args.image or job_image(),
        python=cfg.deps.python,
    )
    cmd = _command(args.cmd) or None
    out: dict[str, Any] = {
        "base": inputs.base(),
        "key": snapshot_key(inputs.base(), cmd),
        "command": cmd,
        "inputs": inputs.describe(),
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    if note:
        print(note.strip())
    print(f"key  {out['key']}" + ("" if cmd else "   (no command: as --bootseer-deps alone)"))
    print(f"base {out['base']}")
    for name, value in out["inputs"].items():
        if name == "key_files":
            for f, digest in value.items():
                print(f"  key file  {f}: sha256 {digest}")
        else:
            print(f"  {name:<10}{value}")
    if cmd:
        print(f"  command   {json.dumps(cmd)}")
    return 0


def _through_agent(request: Request[R], what: str) -> R:
    """A user's view: the node agent reads the store for her (bootseer.deps.views)."""
    from bootseer.agentapi.errors import AgentUnavailable
    from bootseer.cli.caller import this_nodes_agent, through_agent_hint

    try:
        return this_nodes_agent().ask(request)
    except AgentUnavailable as exc:
        why = "users cannot read the store's snapshots"
        raise through_agent_hint(f"deps {what}", why, exc) from None


def cmd_ls(args: argparse.Namespace) -> int:
    from bootseer.deps.gc import SnapshotInfo, list_snapshots

    if os.geteuid() != 0:
        if args.all:
            raise BootseerError("--all is for root; without it you see your own scope")
        reply = _through_agent(DepsList(tuple(args.scope or ())), "ls")
        snaps = [SnapshotInfo(**asdict(s)) for s in reply.snapshots]
    else:
        _, store = _store()
        snaps = list_snapshots(store, _scopes(store, args.scope, args.all))
    if args.json:
        print(json.dumps([s.__dict__ for s in snaps], indent=1))
        return 0
    if not snaps:
        print("no snapshots")
        return 0
    from bootseer.cli.listing import print_table

    now = time.time()
    scopes = sorted({s.scope for s in snaps})
    for i, scope in enumerate(scopes):  # a scope a line of its own: the keys stay whole
        print(("\n" if i else "") + f"scope {scope}")
        print_table(
            ["SIZE", "CAPTURED", "USED", "KEY"],
            [
                [units.iec(s.size), _ago(s.created, now), _ago(s.last_used, now), s.key]
                for s in snaps
                if s.scope == scope
            ],
            right={0, 1, 2},
        )
    return 0


def _ago(t: float, now: float) -> str:
    """How long ago, as ages are written everywhere (``3d``), or ``-``."""
    return f"{units.age(now - t)} ago" if t else "-"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "-"


def cmd_show(args: argparse.Namespace) -> int:
    from bootseer.deps.manifest import Manifest
    from bootseer.deps.restore import read_manifest

    if os.geteuid() != 0:
        from bootseer.config import load_config

        cfg = load_config()
        reply = _through_agent(DepsShow(args.scope or "", args.key), "show")
        m = Manifest.from_json(
            reply.manifest.encode(),
            max_bytes=cfg.deps.max_bytes,
            max_files=cfg.deps.max_files,
            max_frame_bytes=cfg.deps.max_frame_bytes,
        )
        _print_manifest(m, args.files)
        return 0
    cfg, store = _store()
    (scope,) = _scopes(store, [args.scope] if args.scope else None, False)
    found = read_manifest(
        store,
        scope,
        args.key,
        max_bytes=cfg.deps.max_bytes,
        max_files=cfg.deps.max_files,
        max_frame_bytes=cfg.deps.max_frame_bytes,
        keys=None,  # shown, not trusted
    )
    if found is None:
        raise BootseerError(f"no snapshot {args.key} in scope {scope}")
    _print_manifest(found[0], args.files)
    return 0


def _print_manifest(m: Any, files: bool) -> None:
    print(f"snapshot  {m.key} ({m.scope})\nbase      {m.base}\nprefix    {m.prefix}")
    print(f"command   {json.dumps(m.command)}")
    print(f"captured  {_when(m.created)} by {m.user or '?'} (job {m.job_id}, node {m.node})")
    print(
        f"contents  {len(m.entries)} entries, {units.iec(m.raw_bytes)} -> "
        f"{units.iec(m.stored_bytes)} in {len(m.frames)} frames ({m.data})"
    )
    for name, value in m.inputs.items():
        print(f"  {name:<10}{value}")
    if m.skipped:
        print(f"left out  {', '.join(m.skipped[:10])}")
    if files:
        for e in m.entries:
            print(f"  {e.type} {e.size:>12} {e.name}" + (f" -> {e.link}" if e.link else ""))


def cmd_rm(args: argparse.Namespace) -> int:
    require_root("deps rm", "users hold no store credentials")
    from bootseer.deps.gc import remove_snapshot
    from bootseer.deps.layout import SnapshotPaths, is_key

    _, store = _store()
    (scope,) = _scopes(store, [args.scope] if args.scope else None, False)
    status = 0
    for key in args.keys:
        if not is_key(key) or not store.exists(SnapshotPaths(scope, key).manifest):
            print(f"no snapshot {key} in scope {scope}")
            status = 1
            continue
        remove_snapshot(store, scope, key)
        print(f"removed {scope}/{key}")
    return status


def cmd_gc(args: argparse.Namespace) -> int:
    require_root("deps gc", "it removes snapshots and archives from the store")
    from bootseer.deps.gc import list_snapshots, plan_gc, remove_snapshot, sweep

    _, store = _store()
    scopes = _scopes(store, args.scope, args.all)
    now = time.time()
    doomed = plan_gc(
        list_snapshots(store, scopes),
        now=now,
        max_age=args.max_age,
        unused=args.unused,
        max_total=parse_size(args.max_total) if args.max_total else None,
    )
    verb = "would remove" if args.dry_run else "removed"
    for s in doomed:
        if not args.dry_run:
            remove_snapshot(store, s.scope, s.key)
        print(f"{verb} {s.scope}/{s.key} ({units.iec(s.size)}, last used {_ago(s.last_used, now)})")
    if not args.dry_run:
        for scope in scopes:
            for key in sweep(store, scope, now=now, grace=args.grace):
                print(f"swept {key}")
    print(f"{len(doomed)} snapshots, {units.iec(sum(s.size for s in doomed))} {verb}")
    return 0
