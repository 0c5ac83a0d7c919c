"""The ckpt steps of the Prolog and Epilog: mount the job's namespace, unmount it.

``--bootseer-ckpt=NAMESPACE`` names ``<user>/<NAMESPACE>`` on the site's ``[ckpt]
targets``: the user part comes from Slurm, never from the option, so a job reaches
its own user's checkpoints only. The prolog mounts it at ``<mount_root>/<job_id>``
and exports that path as ``BOOTSEER_CKPT``; the epilog unmounts it, even after the
job was killed, and fails the step (so the phase record shows it) when the mount's
daemon had died during the job.

The step is named ``ckpt``: its phase record is the job's ``ckpt_mount``.
"""

from __future__ import annotations

from bootseer.ckpt import mount
from bootseer.ckpt.errors import CkptError
from bootseer.ckpt.names import namespace_name
from bootseer.errors import StepError
from bootseer.nodepaths import NodePaths
from bootseer.stepapi import StepCall, StepResult


def prolog(call: StepCall) -> StepResult:
    ctx, sec = call.ctx, call.cfg.ckpt
    assert ctx.options.ckpt is not None
    if not sec.targets:
        raise StepError("--bootseer-ckpt: the site config has no [ckpt] targets")
    paths = NodePaths(call.cfg)
    try:
        name = namespace_name(ctx.user, ctx.options.ckpt)
    except CkptError as exc:
        raise StepError(str(exc)) from None
    mp = mount.prepare_mountpoint(paths.ckpt_mounts, str(ctx.job_id), ctx.uid, ctx.gid)
    state = call.job.sub("ckpt")
    timeout = mount_wait(call.remaining())
    # The daemon's log outlives the job dir, for whoever looks into a failed mount.
    log_path = paths.ckpt_log(ctx.job_id)
    rec = mount.start(
        mp,
        name,
        ctx.uid,
        ctx.gid,
        state,
        ctx.node,
        timeout,
        log_path,
        sec.kernel_read_ahead_kb,
        job_id=ctx.job_id,
        nodes=ctx.nodes,
        account=ctx.account,
    )
    return StepResult(
        detail=f"mounted {name} ({len(sec.targets)} targets) at {mp}, daemon pid {rec.pid}",
        env={"BOOTSEER_CKPT": str(mp)},
    )


def mount_wait(remaining: float) -> float:
    """How long the prolog waits for the mount: the step's deadline, less a second to
    clean up a mount that did not come. A loaded node's daemon took 27-30 s to come up,
    past the separate 20 s bound this replaced; a job that asked for its mount would
    rather wait than run without it (its tasks wait for the slowest prolog anyway)."""
    return max(1.0, remaining - 1.0)


def epilog(call: StepCall) -> StepResult:
    rec = mount.MountRecord.load(call.job.path / "ckpt")
    if rec is None:
        return StepResult(outcome="skipped", detail="no checkpoint mount recorded by the prolog")
    res = mount.stop(rec)
    if res.died:
        raise StepError(
            f"checkpoint mount {rec.mountpoint} ({rec.namespace}): its daemon (pid {rec.pid}) "
            f"died during the job, which then saw 'Transport endpoint is not connected'; "
            f"cleaned up now. Daemon log: {res.log_tail}"
        )
    how = "forced" if res.forced else "clean"
    t = res.totals
    return StepResult(
        detail=f"unmounted {rec.mountpoint} ({how}): {t.read_bytes} bytes read, "
        f"{t.written_bytes} written, {t.committed} versions committed, "
        f"{t.dropped} writes dropped",
        bytes=t.read_bytes + t.written_bytes,
        # Units this node read from the checkpoint targets, and from the job's other nodes.
        store_bytes=t.store_bytes,
        peer_bytes=t.peer_bytes,
    )
