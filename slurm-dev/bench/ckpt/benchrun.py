"""What the checkpoint benches run by hand share (``write_bench``, ``mount_bench``,
``quota_bench``, ``agent_read``): a state directory of their own, made fresh for the run
and removed after it even on failure (mounts and daemons live under it), and results
written as ``<out>.json`` beside the table as ``<out>.txt``."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any


def add_state_and_out(p: argparse.ArgumentParser, name: str, out_help: str) -> None:
    """``--state-dir`` (default ``$BOOTSEER_TEST_STATE/<name>``, so benches and the test
    suite of one session never share one) and ``--out``."""
    base = Path(os.environ.get("BOOTSEER_TEST_STATE", "/var/tmp/bootseer-bench"))
    p.add_argument("--state-dir", type=Path, default=base / name)
    p.add_argument("--out", type=Path, default=None, help=out_help)


def in_fresh_state(state: Path, run: Callable[[], int]) -> int:
    """``run()`` with ``state`` empty and root's alone (mode 0700); ``state`` is removed
    afterwards whatever ``run`` did."""
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True, mode=0o700)
    try:
        return run()
    finally:
        shutil.rmtree(state, ignore_errors=True)


def write_results(out: Path | None, results: Any, text: str) -> None:
    """Print the table; with ``out``, keep it as ``<out>.txt`` and the records as
    ``<out>.json``."""
    print(text)
    if out:
        out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
        out.with_suffix(".txt").write_text(text + "\n")
