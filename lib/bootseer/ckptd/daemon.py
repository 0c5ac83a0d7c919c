"""The checkpoint mount daemon: one process per job and node, serving one namespace.

:mod:`bootseer.ckpt.mount` starts it (as root, in a session of its own, its stderr the
daemon's log) and stops it::

    python -m bootseer.ckptd --identity-fd 3 --node n1 /run/.../ckpt/42

Whose data it serves (namespace, uid, gid, the job and its nodes) it reads from the
inherited descriptor (:class:`~bootseer.ckpt.mount.Identity`): its command line, which
every user of the node sees in ``ps``, names no user's namespace.

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
    p.add_argument(
        "--identity-fd",
        type=int,
        required=True,
        help="an inherited descriptor holding the namespace, uid, gid, job and its nodes",
    )
    p.add_argument("--node", default="", help="node name for %%n in the site config")
    p.add_argument("--totals", default="", help="where to leave what the mount moved, at exit")
    p.add_argument("mountpoint")
    args = p.parse_args(argv)

    from bootseer.ckpt.mount import Identity
    from bootseer.config import load_config

    try:
        ident = Identity.from_fd(args.identity_fd)
        cfg = load_config()
        if args.node:
            cfg = cfg.for_node(args.node)
        user, _, name = ident.namespace.partition("/")
        from bootseer.sitekey import site_keys

        # Root: it seals what it commits and serves only manifests that verify.
        keys = site_keys(cfg)
        keys.require()
        ns = Namespace.from_config(cfg, namespace_name(user, name), keys=keys)
        from bootseer.recordcache import node_records

        # Manifests kept on the node: an outage of the first target costs no file read here.
        ns.records = node_records(cfg, log)
        from bootseer.ckpt.quota import guard_for

        ns.quota = guard_for(cfg, ns.targets, user, log)
        if ident.job_id and ident.nodes:
            from bootseer.p2p.via import agent_via

            owner = (ident.uid, ident.account)
            # A one-node job's too when the site warms checkpoints: the agent's cache is
            # where the warm-up puts the units (and a later job on the node finds them).
            warms = cfg.ckpt.warm_mib > 0
            nodes = list(ident.nodes)
            ns.via = agent_via(cfg, ident.job_id, nodes, log, owner=owner, one_node=warms)
    except (BootseerError, CkptError) as exc:
        log(f"cannot serve the namespace of fd {args.identity_fd}: {exc}")
        return 1
    from bootseer.nodepaths import JOB_ENV, NodePaths

    stage: Stage | None = None
    try:
        stage = Stage.root_only(NodePaths(cfg).ckpt_stage, cfg.ckpt.stage_bytes)
    except (OSError, CkptError) as exc:
        # Streaming writes work without it; writes out of order then fail (EIO).
        log(f"no staging for writes out of order: {describe(exc)}")
    fs = CkptFS(ns, ident.uid, ident.gid, stage)
    pyfuse3.init(fs, args.mountpoint, mount_options(ns))
    log(
        f"serving {ns.name} over {len(ns.targets)} targets at {args.mountpoint} for uid {ident.uid}"
    )
    from bootseer.ckptd.metrics import CkptMetrics

    metrics = CkptMetrics.start(cfg, fs.counts, log)
    from bootseer.ckpt.warm import Warm, all_of, image_settled, prolog_done

    # The units on their way once the image's hot set is here and the prolog (its
    # restore) has ended, while the container's start leaves the store link room (through
    # the agent, which keeps them).
    settled = (
        all_of(
            image_settled(NodePaths(cfg).agent_socket, ident.job_id),
            prolog_done(NodePaths(cfg).job_dir(ident.job_id) / JOB_ENV),
        )
        if ident.job_id
        else None
    )
    warm = Warm(ns, cfg.ckpt.warm_mib << 20, log=log, settled=settled)
    warm.start()
    try:
        trio.run(serve, fs)
    finally:
        warm.stop()
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
