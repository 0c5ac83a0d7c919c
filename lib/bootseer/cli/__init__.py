"""The ``bootseer`` command: one sub-command module per area, each a thin shell.

A sub-command module defines ``register(subparsers)``, which adds its parser and sets
``handler`` (a function taking the parsed arguments and returning an exit status).
Modules are listed in :data:`COMMANDS`; the heavy imports live inside the handlers,
and a command line that names its command loads only that command's module, so
``bootseer phase ...`` from a training loop stays cheap.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from bootseer.errors import BootseerError

TYPE_CHECKING = False  # typing costs a mark from a job script milliseconds (phase_cmd)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import NoReturn

COMMANDS = (
    "bootseer.cli.config_cmd",
    "bootseer.cli.phase_cmd",
    "bootseer.cli.report_cmd",
    "bootseer.cli.ckpt_cmd",
    "bootseer.cli.image_cmd",
    "bootseer.cli.agent_cmd",
    "bootseer.cli.deps_cmd",
    "bootseer.cli.doctor_cmd",
    "bootseer.cli.install_cmd",
    "bootseer.cli.uninstall_cmd",
)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``bootseer`` parser; for an ``argv`` whose first word is a command, with that
    command alone. A job script's ``bootseer phase end ...`` then loads the phase
    command's module, not all ten and what they import: 0.03 of a mark's 0.07 CPU-s
    (docs/performance.md). Anything else (``--help``, ``--version``, a word that is no
    command) gets every command, so the usage and the errors are the full parser's."""
    from bootseer import __version__

    parser = argparse.ArgumentParser(
        prog="bootseer",
        description="Startup accelerator for training jobs on Slurm.",
    )
    parser.add_argument("--version", action="version", version=f"bootseer {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    named = f"bootseer.cli.{argv[0]}_cmd" if argv else None
    for name in (named,) if named in COMMANDS else COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def plain_doc(doc: str | None) -> str:
    """A module docstring as ``--help`` shows it: without reST's double backquotes and
    ``::`` (a command's docstring is its help text)."""
    import re

    text = (doc or "").replace("``", "")
    return re.sub(r"::$", ":", text, flags=re.MULTILINE)


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return _dispatch(build_parser(args).parse_args(args))


def program() -> NoReturn:
    """The ``bootseer`` program (its console script, ``python -m bootseer.cli``): :func:`main`,
    then, for a command that sets ``exit_at_once`` (``report``), out of the process as
    soon as its output is flushed. pyarrow's reader threads now and then abort the
    interpreter's teardown after the report was written whole (``terminate called
    without an active exception``, SIGABRT; apache/arrow#34314): a read-only command has
    nothing to lose there."""
    args = build_parser(sys.argv[1:]).parse_args()
    status = _dispatch(args)
    if getattr(args, "exit_at_once", False):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


def _dispatch(args: argparse.Namespace) -> int:
    try:
        status: int = args.handler(args)
    except BootseerError as exc:
        print(f"bootseer {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    return status
