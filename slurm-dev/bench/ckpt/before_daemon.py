"""The checkpoint mount daemon of the ``--before`` tree, started by today's
``ckpt.mount.start``: drops the arguments the older daemon does not take (``--totals``,
issue 14's typed totals), then runs it as ``python -m bootseer.ckpt.fuse`` would. The
mount's own arguments and the daemon's behaviour are the older tree's, unchanged."""

from __future__ import annotations

import runpy
import sys

NEWER_ARGS = ("--totals",)  # each takes one value

for name in NEWER_ARGS:
    if name in sys.argv:
        i = sys.argv.index(name)
        del sys.argv[i : i + 2]
runpy.run_module("bootseer.ckpt.fuse", run_name="__main__", alter_sys=True)
