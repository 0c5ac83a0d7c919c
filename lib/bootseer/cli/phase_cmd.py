"""``bootseer phase start|end|run|compact``: mark a job's own startup phases.

From a job script::

    bootseer phase start ckpt_load
    python load.py
    bootseer phase end ckpt_load
    bootseer phase run deps_install -- pip install -r requirements.txt
    ...
    bootseer phase end first_step     # startup is over

Standard names: container_start, deps_install, ckpt_load, framework_init,
first_step. A mark never fails the job: without a spool (no ``--bootseer``) it
says so and exits 0. ``compact`` is the admin's daily maintenance of the
dataset (docs/report.md).
"""

from __future__ import annotations

import argparse
import sys

from bootseer.cli import plain_doc
from bootseer.errors import BootseerError

TYPE_CHECKING = False  # typing costs a mark from a job script milliseconds
if TYPE_CHECKING:
    from typing import Any

OUTCOMES = ("ok", "failed", "skipped", "timed_out")  # bootseer.stepapi's (a test checks)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "phase",
        help="mark a startup phase from inside a job",
        description=plain_doc(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ps = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action in ("start", "end"):
        a = ps.add_parser(action, help=f"phase NAME {action}s now")
        a.add_argument("name", metavar="NAME")
        if action == "end":
            a.add_argument("--outcome", choices=OUTCOMES, default="ok")
            a.add_argument("--bytes", type=int, default=0, help="bytes the phase moved")
            a.add_argument(
                "--store-bytes", type=int, default=0, help="of those, bytes from the store"
            )
            a.add_argument(
                "--peer-bytes", type=int, default=0, help="of those, bytes from other nodes"
            )
        a.add_argument("--detail", default="", help="a short note kept with the record")
        a.set_defaults(handler=mark)
    r = ps.add_parser("run", help="run CMD as phase NAME (failed if it exits non-zero)")
    r.add_argument("name", metavar="NAME")
    r.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD...")
    r.set_defaults(handler=run)
    c = ps.add_parser("compact", help="admin: merge finished days' small files into one each")
    c.add_argument(
        "--older-than",
        default="1d",
        metavar="AGE",
        help="compact days that ended at least this long ago (default 1d)",
    )
    c.add_argument("--store", metavar="URI", help="the store (default: the site config's)")
    c.add_argument(
        "--adopt-unsealed",
        action="store_true",
        help="first seal, as they are, the files without a seal (written before bootseer "
        "sealed them): once, after upgrading; root's reports count no unsealed file",
    )
    c.set_defaults(handler=compact)


def _check(name: str) -> None:
    from bootseer.phases.marks import PHASE_NAME

    if PHASE_NAME.match(name):
        return
    from bootseer.phases.schema import check_phase_name

    try:
        check_phase_name(name)
    except ValueError as exc:
        raise BootseerError(str(exc)) from None


def mark(args: argparse.Namespace) -> int:
    from bootseer.phases.marks import mark as do_mark

    _check(args.name)
    do_mark(
        args.action,
        args.name,
        outcome=getattr(args, "outcome", "ok"),
        detail=args.detail,
        bytes=getattr(args, "bytes", 0),
        store_bytes=getattr(args, "store_bytes", 0),
        peer_bytes=getattr(args, "peer_bytes", 0),
    )
    return 0


def run(args: argparse.Namespace) -> int:
    from bootseer.phases.marks import mark as do_mark

    _check(args.name)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise BootseerError("phase run NAME -- CMD...: no command given")
    import subprocess

    do_mark("start", args.name)
    try:
        status = subprocess.call(cmd)
    except OSError as exc:
        do_mark("end", args.name, outcome="failed", detail=f"cannot run {cmd[0]}: {exc.strerror}")
        print(f"bootseer phase run: cannot run {cmd[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    except KeyboardInterrupt:
        do_mark("end", args.name, outcome="failed", detail="interrupted")
        raise
    if status == 0:
        do_mark("end", args.name)
    else:
        do_mark("end", args.name, outcome="failed", detail=f"{cmd[0]} exited with {status}")
    return status if status >= 0 else 128 - status


def compact(args: argparse.Namespace) -> int:
    from bootseer.cli.caller import require_root

    require_root("phase compact", "it rewrites the phase dataset")
    from bootseer.cli.report_cmd import open_report_store, parse_age
    from bootseer.config import load_config
    from bootseer.phases.compact import compact as do_compact
    from bootseer.sitekey import keys_if_root

    keys = keys_if_root(load_config())  # root's: the day's file is sealed
    store = open_report_store(args.store)
    if args.adopt_unsealed:
        from bootseer.phases.compact import adopt_unsealed

        assert keys is not None  # root's, or keys_if_root raised
        adopted = adopt_unsealed(store, keys)
        print(f"sealed {len(adopted)} file(s) written before seals")
    done = do_compact(
        store,
        older_than_days=parse_age(args.older_than) / 86400,
        progress=lambda c: print(
            f"{c.day}: {c.files_in} files -> {c.key} ({c.rows_out} rows)"
            + (f"; {c.refused} file(s) left, their seal does not verify" if c.refused else "")
        ),
        keys=keys,
    )
    if not done:
        print("nothing to compact")
    return 0
