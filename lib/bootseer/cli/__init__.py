"""The ``bootseer`` command: one sub-command module per area, each a thin shell.

A sub-command module defines ``register(subparsers)``, which adds its parser and sets
``handler`` (a function taking the parsed arguments and returning an exit status).
Modules are listed in :data:`COMMANDS`; the heavy imports live inside the handlers,
so ``bootseer phase ...`` from a training loop stays cheap.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from bootseer.errors import BootseerError

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


def build_parser() -> argparse.ArgumentParser:
    from bootseer import __version__

    parser = argparse.ArgumentParser(
        prog="bootseer",
        description="Startup accelerator for training jobs on Slurm.",
    )
    parser.add_argument("--version", action="version", version=f"bootseer {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def plain_doc(doc: str | None) -> str:
    """A module docstring as ``--help`` shows it: without reST's double backquotes and
    ``::`` (a command's docstring is its help text)."""
    import re

    text = (doc or "").replace("``", "")
    return re.sub(r"::$", ":", text, flags=re.MULTILINE)


def main(argv: Sequence[str] | None = None) -> int:
    return _dispatch(build_parser().parse_args(argv))


def program() -> NoReturn:
    """The ``bootseer`` program (its console script, ``python -m bootseer.cli``): :func:`main`,
    then, for a command that sets ``exit_at_once`` (``report``), out of the process as
    soon as its output is flushed. pyarrow's reader threads now and then abort the
    interpreter's teardown after the report was written whole (``terminate called
    without an active exception``, SIGABRT; apache/arrow#34314): a read-only command has
    nothing to lose there."""
    args = build_parser().parse_args()
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
