"""The checkpoint mount daemon: one process per job and node, serving one namespace.

:mod:`bootseer.ckpt.mount` starts it (as root, in a session of its own, its stderr the
daemon's log) and stops it::

    python -m bootseer.ckptd --namespace ada/llama --uid 1000 --gid 1000 /run/.../ckpt/42

It opens the namespace with the site's keys and the user's quota, mounts
:class:`~bootseer.ckptd.fs.CkptFS`, serves until unmounted or signalled (SIGTERM,
SIGINT), drops writes nobody closed, and leaves what the mount moved for the epilog
(``--totals``, :class:`~bootseer.ckpt.totals.MountTotals`).
"""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

import pyfuse3
import trio

from bootseer.ckpt.errors import CkptError
from bootseer.ckpt.names import namespace_name
from bootseer.ckpt.namespace import Namespace
from bootseer.ckpt.stage import Stage
from bootseer.ckptd.fs import CkptFS, mount_options
from bootseer.ckptd.log import log
from bootseer.errors import BootseerError, describe


async def serve(fs: CkptFS) -> None:
    """Serve until unmounted (``fusermount3 -u``) or told to stop (SIGTERM, SIGINT)."""
    async with trio.open_nursery() as nursery:

        async def run_fuse() -> None:
            await pyfuse3.main(max_tasks=64)
            nursery.cancel_scope.cancel()

        async def on_signal() -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    log(f"signal {signum}: unmounting", last=True)
                    nursery.cancel_scope.cancel()
                    return

        nursery.start_soon(run_fuse)
        nursery.start_soon(on_signal)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bootseer.ckptd",
        description="Serve a striped checkpoint namespace over FUSE.",
    )
    p.add_argument("--namespace", required=True, help="<user>/<name>")
    p.add_argument("--uid", type=int, required=True)
    p.add_argument("--gid", type=int, required=True)
    p.add_argument("--node", default="", help="node name for %%n in the site config")
    p.add_argument("--job-id", type=int, default=0, help="the job, for its peers")
    p.add_argument("--nodes", default="", help="the job's nodes, comma-separated: its peers")
    p.add_argument("--totals", default="", help="where to leave what the mount moved, at exit")
    p.add_argument("mountpoint")
    args = p.parse_args(argv)

    from bootseer.config import load_config

    try:
        cfg = load_config()
        if args.node:
            cfg = cfg.for_node(args.node)
        user, _, name = args.namespace.partition("/")
        from bootseer.sitekey import site_keys

        # Root: it seals what it commits and serves only manifests that verify.
        keys = site_keys(cfg)
        keys.require()
        ns = Namespace.from_config(cfg, namespace_name(user, name), keys=keys)
        from bootseer.ckpt.quota import guard_for

        ns.quota = guard_for(cfg, ns.targets, user, log)
        if args.job_id and args.nodes:
            from bootseer.p2p.via import agent_via

            ns.via = agent_via(cfg, args.job_id, args.nodes.split(","), log)
    except (BootseerError, CkptError) as exc:
        log(f"cannot serve {args.namespace}: {exc}")
        return 1
    from bootseer.nodepaths import NodePaths

    stage: Stage | None = None
    try:
        stage = Stage.root_only(NodePaths(cfg).ckpt_stage, cfg.ckpt.stage_bytes)
    except (OSError, CkptError) as exc:
        # Streaming writes work without it; writes out of order then fail (EIO).
        log(f"no staging for writes out of order: {describe(exc)}")
    fs = CkptFS(ns, args.uid, args.gid, stage)
    pyfuse3.init(fs, args.mountpoint, mount_options(ns))
    log(f"serving {ns.name} over {len(ns.targets)} targets at {args.mountpoint} for uid {args.uid}")
    from bootseer.ckptd.metrics import CkptMetrics

    metrics = CkptMetrics.start(cfg, fs.counts, log)
    try:
        trio.run(serve, fs)
    finally:
        fs.abort_all()
        pyfuse3.close(unmount=True)
        if stage is not None:
            stage.close()  # leaves the node's staging ledger
        if metrics is not None:
            metrics.stop()
        counts = fs.counts()
        totals = counts.totals()
        log(f"unmounted; {totals} in {counts.reads} read requests", last=True)
        if args.totals:
            totals.write(Path(args.totals))
    return 0
