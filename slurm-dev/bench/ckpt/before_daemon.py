"""The checkpoint mount daemon of the ``--before`` tree, started by today's
``ckpt.mount.start``: drops the arguments the older daemon does not take (``--totals``,
issue 14's typed totals), turns ``--identity-fd`` (issue 21: the namespace and uid in an
inherited descriptor, not on the command line) back into the older arguments, then runs
it as ``python -m bootseer.ckpt.fuse`` would. The mount's own arguments and the daemon's
behaviour are the older tree's, unchanged. A tree that has ``bootseer.ckptd`` runs it as
it is."""

from __future__ import annotations

import importlib.util
import json
import os
import runpy
import sys

if importlib.util.find_spec("bootseer.ckptd") is not None:
    # A tree after issue 18's move (the daemon its own package) takes today's arguments.
    runpy.run_module("bootseer.ckptd", run_name="__main__", alter_sys=True)
    sys.exit(0)

NEWER_ARGS = ("--totals",)  # each takes one value

for name in NEWER_ARGS:
    if name in sys.argv:
        i = sys.argv.index(name)
        del sys.argv[i : i + 2]
if "--identity-fd" in sys.argv:
    i = sys.argv.index("--identity-fd")
    fd = int(sys.argv[i + 1])
    ident = json.loads(os.read(fd, 1 << 20))
    os.close(fd)
    sys.argv[i : i + 2] = [
        "--namespace", ident["namespace"],
        "--uid", str(ident["uid"]),
        "--gid", str(ident["gid"]),
        "--job-id", str(ident.get("job_id", 0)),
        "--nodes", ",".join(ident.get("nodes", ())),
    ]  # fmt: skip
runpy.run_module("bootseer.ckpt.fuse", run_name="__main__", alter_sys=True)
