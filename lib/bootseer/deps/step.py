"""The deps steps of the Prolog (restore) and Epilog (capture).

Both are registered as step ``deps`` (``bootseer.hooks.steps``); the phase records
name them ``deps_restore`` (prolog) and ``deps_capture`` (epilog). A failure raises
a :class:`StepError` whose message the phase record carries; the job then installs
the ordinary way and, if it did, the epilog captures what it installed.

The prolog exports to the job's tasks ``BOOTSEER_DEPS_PREFIX`` and, after a restore,
``BOOTSEER_DEPS_KEY`` (the snapshot key it restored).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from bootseer import nodepaths
from bootseer.asuser import UserChild, UserChildError, user_groups
from bootseer.config import SiteConfig
from bootseer.context import JobContext
from bootseer.deps import jobstate
from bootseer.deps.key import hash_key_files_as, key_inputs, scope_dir, snapshot_key
from bootseer.deps.layout import SnapshotPaths
from bootseer.deps.prefix import unsafe_reason
from bootseer.errors import ManifestError, StepError
from bootseer.recordcache import node_records
from bootseer.sitekey import site_keys
from bootseer.stepapi import StepCall, StepResult

MARK_WAIT = 5.0  # seconds the prolog waits for the store to take a last-use mark

if TYPE_CHECKING:
    from bootseer.deps.manifest import Manifest
    from bootseer.deps.restore import FrameVia
    from bootseer.options import Scope
    from bootseer.store import Store


def effective_scope(asked: Scope, cfg: SiteConfig) -> tuple[Scope, str]:
    """The scope a job gets: what it asked for if the site allows it, else ``user``.

    ``account`` also needs a Slurm that checks the job's account against its user:
    otherwise ``--account`` is any name the user writes, and a user could put her
    install into another account's scope, to be restored and run in its members' jobs."""
    if asked != "user" and asked not in cfg.deps.scopes:
        return "user", f"scope={asked} not allowed by the site (deps.scopes); using scope=user. "
    if asked == "account":
        from bootseer.slurm.accounts import account_check

        why = account_check(str(cfg.deps.scontrol), 5.0)
        if why:
            return "user", f"scope=account refused: {why}; using scope=user. "
    return asked, ""


# The job user's deps/job/ is a tmpfs of this size: her install record (and its
# temporary copy while deps run replaces it) and root's copy of the prolog's state.
USER_DIR_BYTES = 2 * jobstate.MAX_RECORD + (1 << 20)


def _user_dir(path: Path, uid: int, gid: int) -> None:
    """The job user's ``deps/job/``, hers (0700). A directory she may write in
    ``<run_dir>`` (``/run``: slurmd's, munge's and every job's files) is a tmpfs of its
    own, as the phase spool is: whatever she writes there fills that, never ``/run``.
    Not mounted (no ``CAP_SYS_ADMIN``, a container): a plain directory."""
    from bootseer import mounts

    os.makedirs(path, mode=0o700, exist_ok=True)
    if os.geteuid() == 0 and not mounts.is_mounted(path):
        with contextlib.suppress(OSError):
            mounts.mount_tmpfs(path, USER_DIR_BYTES, mode=0o700)
    st = os.lstat(path)
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.chown(path, uid, gid, follow_symlinks=False)
    os.chmod(path, 0o700)


def prolog(call: StepCall) -> StepResult:
    ctx, cfg = call.ctx, call.cfg
    spec = ctx.options.deps
    assert spec is not None
    t0 = time.monotonic()
    state_dir = call.job.sub("deps", mode=0o711)  # the user passes through to job/
    _user_dir(nodepaths.install_record(cfg.paths.run_dir, ctx.job_id).parent, ctx.uid, ctx.gid)
    scope, note = effective_scope(spec.scope, cfg)
    sdir = scope_dir(scope, ctx.user, ctx.account)
    groups = user_groups(ctx.user, ctx.gid)
    files = hash_key_files_as(
        ctx.uid,
        ctx.gid,
        groups,
        spec.keys,
        ctx.work_dir,
        cfg.deps.max_key_file_bytes,
        timeout=min(30.0, call.remaining()),
    )
    inputs = key_inputs(
        scope=sdir,
        prefix=spec.prefix,
        key_files=files,
        image=ctx.options.image,
        python=cfg.deps.python,
    )
    base = inputs.base()
    state = jobstate.PrologState(base=base, scope=sdir, prefix=spec.prefix, uid=ctx.uid)
    state_path = state_dir / nodepaths.DEPS_STATE
    user_copy = nodepaths.deps_job_state(cfg.paths.run_dir, ctx.job_id)
    # First: a failed restore still leaves the job what deps run needs. Root's copy is for
    # the epilog (0600); deps run reads the one in the user's own 0700 directory.
    state.write(state_path)
    state.write(user_copy, mode=0o644)
    # (`bootseer deps run` checks the prefix again, as the user, and refuses it too.)
    unsafe = unsafe_reason(spec.prefix, ctx.uid)
    if unsafe:
        raise StepError(
            f"refusing --bootseer-deps prefix {spec.prefix} on {ctx.node}: {unsafe}. "
            "Use a directory of your own (e.g. under /tmp or the node's local disk)"
        )
    env = {"BOOTSEER_DEPS_PREFIX": spec.prefix}
    if ctx.options.mode == "refresh":
        return StepResult(
            outcome="skipped", env=env, detail=f"{note}refresh asked: not restoring base {base}"
        )

    from bootseer.deps import nodecache
    from bootseer.deps.restore import RestoreRequest, find_snapshot, read_manifest, restore

    # Without a request: with the store hung, the node's records and the job's peers
    # still restore (bootseer.recordcache, bootseer.p2p.fallback).
    store = cfg.store.open(create=False, look=False)
    limits = {
        "max_bytes": cfg.deps.max_bytes,
        "max_files": cfg.deps.max_files,
        "max_frame_bytes": cfg.deps.max_frame_bytes,
    }
    # A ref or manifest that does not verify under the site key is refused (SealError):
    # not dropped, since a node whose key file is missing or not yet rotated cannot tell
    # a planted record from a genuine one; the epilog captures over a planted one.
    keys = site_keys(cfg)
    # The ref and manifest as this node last read them: the manifest is read once per
    # node, and a store outage does not take what a node already had.
    records = node_records(cfg, call.log)
    none = StepResult(
        outcome="skipped",
        env=env,
        detail=f"{note}no snapshot for base {base} in {sdir}: the job installs",
    )
    try:
        key = find_snapshot(store, sdir, base, keys=keys, records=records)
    except ManifestError as exc:
        _drop_broken(call, store, sdir, base, None, None, exc)
    if key is None:
        return none
    cache = cfg.paths.cache_dir
    with nodecache.prefix_lock(cache, spec.prefix, timeout=call.remaining()):
        stamp = nodecache.read_stamp(cache, spec.prefix)
        ours = stamp is not None and stamp.matches(spec.prefix, ctx.uid)
        if ours and stamp is not None and stamp.key == key:
            # The tree the stamp names is this snapshot's, checked when it was restored:
            # its manifest (16,000 entries for torch: 40 ms to parse) is not needed.
            detail = (
                f"{note}snapshot {key} already in {spec.prefix} (restored or installed "
                "earlier on this node)"
            )
            fetched, entries, peer_bytes, mbytes = 0, 0, 0, 0
        else:
            if ours and stamp is not None and not _empty_dir(spec.prefix):
                # Before the manifest: a refused restore reads none.
                _refuse_if_in_use(call, spec.prefix, key, stamp.key)
            try:
                found = read_manifest(store, sdir, key, **limits, keys=keys, records=records)
            except ManifestError as exc:
                _drop_broken(call, store, sdir, base, key, None, exc)
            if found is None:
                return none
            manifest, mbytes = found
            if os.path.lexists(spec.prefix) and not ours and not _empty_dir(spec.prefix):
                raise StepError(
                    f"{spec.prefix} exists on {ctx.node} and was not restored by bootseer; "
                    "not replacing it (remove it, or use a prefix per job)"
                )
            req = RestoreRequest(
                prefix=spec.prefix,
                uid=ctx.uid,
                gid=ctx.gid,
                groups=groups,
                link_roots=cfg.deps.link_roots,
                max_bytes=cfg.deps.max_bytes,
                max_files=cfg.deps.max_files,
                max_frame_bytes=cfg.deps.max_frame_bytes,
                threads=cfg.deps.threads,
                timeout=max(1.0, call.remaining()),
                replace=ours,
            )
            try:
                done = restore(store, manifest, req, via=_via_peers(call))
            except ManifestError as exc:
                _drop_broken(call, store, sdir, base, key, manifest, exc)
            nodecache.write_stamp(
                cache, nodecache.Stamp(spec.prefix, key, ctx.uid, done.dev, done.ino, time.time())
            )
            fetched, entries, peer_bytes = done.fetched, done.entries, done.peer_bytes
            detail = (
                f"{note}restored {key} into {spec.prefix}: {entries} entries, "
                f"{manifest.raw_bytes} bytes"
            )  # from where: store_bytes and peer_bytes of the phase row
    if ctx.first_node and not nodecache.marked_lately(cache, sdir, key):
        used = SnapshotPaths(sdir, key).used

        def mark() -> None:
            try:
                # In place: one request, not a temp object and a move; nothing needs it whole.
                store.write_bytes(used, f"{time.time():.0f}".encode(), atomic=False)
            except Exception as exc:  # last-use marks serve gc; never worth failing a restore
                call.log(f"step=deps could not mark {key} used: {exc!r}")
            else:
                nodecache.note_marked(cache, sdir, key)

        # A hung store holds no prolog up for a mark: it is left behind after a while.
        marker = threading.Thread(target=mark, daemon=True)
        marker.start()
        marker.join(MARK_WAIT)
    state.restored = key
    state.write(state_path)
    state.write(user_copy, mode=0o644)
    env["BOOTSEER_DEPS_KEY"] = key
    return StepResult(
        detail=f"{detail} in {time.monotonic() - t0:.2f}s",
        bytes=fetched + mbytes + peer_bytes,
        store_bytes=fetched + mbytes,
        peer_bytes=peer_bytes,
        env=env,
    )


def _refuse_if_in_use(call: StepCall, prefix: str, key: str, in_place: str) -> None:
    """:class:`StepError` if another running job of the user on this node uses ``prefix``,
    which holds snapshot ``in_place``: replacing it by ``key`` would change that job's
    dependencies under it (:mod:`bootseer.deps.prefixuse`). Called with the prefix's
    lock held, so no other prolog replaces it between this look and the restore."""
    from bootseer.deps import prefixuse

    ctx, cfg = call.ctx, call.cfg
    users = prefixuse.running_users(
        cfg.paths.run_dir,
        prefix,
        ctx.uid,
        ctx.job_id,
        node=ctx.node,
        squeue=cfg.phases.squeue,
        timeout=max(1.0, min(cfg.phases.squeue_timeout, call.remaining() / 2)),
    )
    if not users:
        return
    jobs = ", ".join(u.describe() for u in users)
    # Prefix and job first: the job's stderr is told the first 240 characters.
    raise StepError(
        f"{prefix} on {ctx.node} is in use by {jobs}: not replacing snapshot {in_place} "
        f"in it by {key} under that job; the job installs the ordinary way (use a prefix "
        "per job, e.g. with the job id in it, to run different dependencies side by side)"
    )


def _drop_broken(
    call: StepCall,
    store: Store,
    scope: str,
    base: str,
    key: str | None,
    manifest: Manifest | None,
    exc: Exception,
) -> NoReturn:
    """A snapshot (its ref, manifest or archive) failed verification: drop it from the
    store, so this job's install is captured in its place rather than the broken one
    restored by every later job; the step fails, and the job installs."""
    from bootseer.deps.layout import ref_path
    from bootseer.deps.restore import drop_snapshot, find_snapshot

    cfg = call.cfg
    what = f"snapshot {key}" if key else f"the ref of base {base} in {scope}"
    # The node's copies go first: a capture may put a good snapshot where this one was.
    records = node_records(cfg)
    records.forget(ref_path(scope, base))
    if key is not None:
        records.forget(SnapshotPaths(scope, key).manifest)
    try:
        if key is None:
            try:
                # still broken, not rewritten meanwhile?
                find_snapshot(store, scope, base, keys=site_keys(cfg))
            except ManifestError:
                store.delete(ref_path(scope, base))
        else:
            drop_snapshot(
                store,
                scope,
                base,
                key,
                manifest,
                max_bytes=cfg.deps.max_bytes,
                max_files=cfg.deps.max_files,
                max_frame_bytes=cfg.deps.max_frame_bytes,
                keys=site_keys(cfg),
            )
        dropped = "dropped it from the store; the job installs and its epilog captures anew"
    except Exception as drop_exc:
        dropped = f"could not drop it ({drop_exc!r}); the job installs"
    raise StepError(f"{what} is broken ({exc}): {dropped}") from None


def _via_peers(call: StepCall) -> FrameVia | None:
    """Frames through the node agent, which shares them among the job's nodes (each frame
    leaves the store once per job); None for a one-node job or without p2p."""
    from bootseer.p2p.via import agent_via

    ctx = call.ctx
    via = agent_via(
        call.cfg,
        ctx.job_id,
        ctx.nodes,
        lambda m: call.log(f"step=deps {m}"),
        timeout=max(1.0, call.remaining() - 1.0),
        owner=(ctx.uid, ctx.account),
    )
    if via is None:
        return None

    def frame(key: str, offset: int, length: int, digest: str) -> tuple[bytes, str] | None:
        got = via("", key, offset, length, digest)
        # Out of the via's buffer, which it hands out again once dropped: the decoder
        # threads hold frames past the next fetch.
        return None if got is None else (bytes(got[0]), got[1])

    return frame


def _empty_dir(path: str) -> bool:
    try:
        return os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path)
    except OSError:
        return False


def epilog(call: StepCall) -> StepResult:
    """Capture what the job installed (first node), then, on every node, delete the old
    trees that restores and ``deps run`` set aside (:mod:`bootseer.deps.oldtree`)."""
    try:
        result = _capture_step(call)
    except BaseException:
        with contextlib.suppress(Exception):  # the capture's failure is the one to report
            _sweep_old_trees(call)
        raise
    swept = _sweep_old_trees(call)
    return dataclasses.replace(result, detail=f"{result.detail}; {swept}") if swept else result


# Seconds of the epilog's budget the sweep leaves to the phase rows and the other steps.
SWEEP_MARGIN = 2.0
# Seconds the epilog waits for the prefix's lock to retire extraction leftovers: one
# held longer is a restore into the prefix at work; the leftovers wait for a later epilog.
RETIRE_LOCK_WAIT = 2.0


def _sweep_old_trees(call: StepCall) -> str:
    """Delete the old trees beside the job's prefix, as the job's user, and first retire
    into holders what killed restores left (:func:`_retire_extractions`); a note for the
    phase row ("" when there were none). Bounded by the step's deadline: a sweep cut short
    leaves the rest to the next job's epilog. Never fails the step: the job's own work is
    done, and a tree left aside is only disk space until the next sweep."""
    from bootseer.deps import oldtree

    ctx = call.ctx
    spec = ctx.options.deps
    if spec is None:
        return ""
    prefix = spec.prefix
    names, leftovers = oldtree.beside(prefix)
    if not names and not leftovers:
        return ""
    budget = call.remaining() - SWEEP_MARGIN
    if budget < 1.0:
        n = len(names) + len(leftovers)
        return f"{n} old trees beside {prefix} left for a later epilog (no time)"
    retired = ""
    if leftovers:
        retired = _retire_extractions(call, prefix, leftovers, budget / 2)
        names = oldtree.holders(prefix)
        if not names:
            return retired
        budget = call.remaining() - SWEEP_MARGIN
    t0 = time.monotonic()
    try:
        got = _as_user(ctx, lambda: oldtree.sweep(prefix, names), budget)
    except (UserChildError, OSError) as exc:  # OSError: no fork, no pipe
        call.log(f"step=deps old trees beside {prefix}: {exc}")
        return f"{retired}old trees beside {prefix} not all deleted ({exc}); a later epilog goes on"
    note = f"deleted {got['removed']} old trees beside {prefix} in {time.monotonic() - t0:.2f}s"
    return retired + note + (f" ({got['left']} left)" if got["left"] else "")


def _as_user(ctx: JobContext, work: Callable[[], dict[str, int]], budget: float) -> dict[str, int]:
    """``work()``'s counts, done in a child with the job user's uid, gid and groups."""
    child = UserChild.start(
        ctx.uid, ctx.gid, lambda _i, _o: work(), groups=user_groups(ctx.user, ctx.gid)
    )
    got: dict[str, int] = child.result(timeout=max(0.5, budget))
    return got


def _retire_extractions(call: StepCall, prefix: str, leftovers: list[str], budget: float) -> str:
    """Rename what killed restores left beside ``prefix`` into holders, as the job's user,
    with the node's lock of the prefix held: no restore into it runs meanwhile, so none of
    them is one still being written (:func:`bootseer.deps.oldtree.retire`). A note ending
    in "; " for the phase row ("" when none was the user's)."""
    from bootseer.deps import nodecache, oldtree

    ctx = call.ctx
    try:
        with nodecache.prefix_lock(
            call.cfg.paths.cache_dir, prefix, timeout=min(RETIRE_LOCK_WAIT, budget)
        ):
            got = _as_user(ctx, lambda: oldtree.retire(prefix, leftovers), budget)
    except StepError:
        return f"{len(leftovers)} extraction dirs beside {prefix} kept (a restore into it runs); "
    except (UserChildError, OSError) as exc:
        call.log(f"step=deps extraction dirs beside {prefix}: {exc}")
        return f"extraction dirs beside {prefix} not retired ({exc}); "
    if not got["retired"]:
        return ""
    return f"{got['retired']} extraction dirs of killed restores set aside; "


def _capture_step(call: StepCall) -> StepResult:
    ctx, cfg = call.ctx, call.cfg
    state = jobstate.PrologState.read(nodepaths.deps_state(cfg.paths.run_dir, ctx.job_id))
    if state is None:
        return StepResult(outcome="skipped", detail="no prolog state: nothing to capture")
    record = _install_record(
        ctx, str(nodepaths.install_record(cfg.paths.run_dir, ctx.job_id)), call.remaining()
    )
    succeeded = record is not None and record["status"] == 0
    if record is not None and succeeded and record["fresh"] and record["prefix"] == state.prefix:
        cmd = record["command"]
        key = snapshot_key(state.base, list(cmd) if isinstance(cmd, list) else None)
        _stamp_install(call, state.prefix, key)
    if not ctx.first_node:
        return StepResult(outcome="skipped", detail="the job's first node captures")
    if record is None and state.restored:
        return StepResult(outcome="skipped", detail=f"restored {state.restored}; nothing installed")
    # Only what `bootseer deps run` installed, never whatever directory the job named.
    if record is None:
        return StepResult(
            outcome="skipped",
            detail=f"nothing installed by `bootseer deps run` into {state.prefix}: not captured",
        )
    if not succeeded:
        return StepResult(
            outcome="skipped",
            detail=f"the install into {state.prefix} failed (exit {record['status']}): "
            "not captured",
        )
    if not record["fresh"] or record["prefix"] != state.prefix:
        return StepResult(
            outcome="skipped",
            detail=f"{state.prefix} was not empty before the install: not captured",
        )
    if not os.path.isdir(state.prefix):
        return StepResult(
            outcome="skipped", detail=f"{state.prefix} does not exist: nothing to capture"
        )
    unsafe = unsafe_reason(state.prefix, ctx.uid)
    if unsafe:
        raise StepError(f"not capturing {state.prefix} on {ctx.node}: {unsafe}")
    return capture_for_job(call, ctx, cfg, state, record["command"], record["names"])


def _stamp_install(call: StepCall, prefix: str, key: str) -> None:
    """Note on this node that ``prefix`` holds what the job installed (snapshot key and
    all), so a restart on this node finds it in place instead of refusing a non-empty
    prefix. The stamp names the directory itself (device, inode, owner): a prefix
    replaced or removed since no longer matches it."""
    from bootseer.deps import nodecache

    try:
        st = os.lstat(prefix)
    except OSError:
        return
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != call.ctx.uid:
        return
    cache = call.cfg.paths.cache_dir
    with nodecache.prefix_lock(cache, prefix, timeout=min(10.0, call.remaining())):
        stamp = nodecache.Stamp(prefix, key, call.ctx.uid, st.st_dev, st.st_ino, time.time())
        nodecache.write_stamp(cache, stamp)


def _install_record(ctx: JobContext, path: str, timeout: float) -> dict[str, object] | None:
    child = UserChild.start(ctx.uid, ctx.gid, lambda _i, _o: jobstate.read_install_record(path))
    try:
        rec: dict[str, object] | None = child.result(timeout=min(30.0, timeout))
    except UserChildError as exc:
        raise StepError(f"cannot read the job's install record {path}: {exc}") from None
    return rec


def capture_for_job(
    call: StepCall,
    ctx: JobContext,
    cfg: SiteConfig,
    state: jobstate.PrologState,
    command: object,
    names: object,
) -> StepResult:
    from bootseer.deps.capture import CaptureRequest, capture, snapshot_exists, write_ref
    from bootseer.deps.quota import SnapshotQuotaExceeded, scope_quota

    cmd = list(command) if isinstance(command, list) else None
    key = snapshot_key(state.base, cmd)
    store = cfg.store.open()
    keys = site_keys(cfg)
    if snapshot_exists(store, state.scope, key, keys=keys):
        write_ref(store, state.scope, state.base, key, cmd, keys=keys)
        return StepResult(outcome="skipped", detail=f"snapshot {key} already in the store")
    quota = scope_quota(store, state.scope, cfg.deps.quota)
    over = (
        f"not captured: {quota.describe()} (an admin frees room with `bootseer deps gc` "
        "or raises deps.quota); the next run installs again"
    )
    if quota.room == 0:
        return StepResult(outcome="skipped", detail=f"{state.prefix} {over}")
    req = CaptureRequest(
        prefix=state.prefix,
        scope=state.scope,
        base=state.base,
        key=key,
        uid=ctx.uid,
        gid=ctx.gid,
        groups=user_groups(ctx.user, ctx.gid),
        names=list(names) if isinstance(names, list) else None,
        command=cmd,
        user=ctx.user,
        job_id=ctx.job_id,
        node=ctx.node,
        frame_bytes=cfg.deps.frame_bytes,
        level=cfg.deps.level,
        threads=cfg.deps.threads,
        max_bytes=cfg.deps.max_bytes,
        max_files=cfg.deps.max_files,
        timeout=max(1.0, call.remaining()),
        max_stored=quota.room,
        quota_note=quota.describe(),
    )
    try:
        m = capture(store, req, keys=keys)
    except SnapshotQuotaExceeded:
        return StepResult(
            outcome="skipped", detail=f"{state.prefix} is larger than the room left: {over}"
        )
    return StepResult(
        detail=f"captured {key} from {state.prefix}: {len(m.entries)} entries, "
        f"{m.raw_bytes} bytes -> {m.stored_bytes} stored",
        bytes=m.stored_bytes,
    )
