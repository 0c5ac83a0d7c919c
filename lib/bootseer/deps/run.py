"""``bootseer deps run``: wrap a job's install so a snapshot replaces it next time.

Inside a job that asked for ``--bootseer-deps`` the prolog has already restored the
snapshot, if there was one; ``deps run`` then compares the snapshot key with the one
its own command gives and skips the install when they agree. Otherwise it runs the
install, notes what it added under the prefix, and leaves the capture to the epilog
(the job's time is the user's; the epilog runs once, on the first node).

Outside such a job (a person on a login node, or a job without the option) it does
both sides itself: restore if the store has the snapshot and the prefix does not
exist yet, else install and capture right after, with progress on a terminal.

    rc = run_install(["pip", "install", "-r", "requirements.txt"],
                     RunOptions(prefix="/tmp/venv", key_files=["requirements.txt"]))
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bootseer import nodepaths
from bootseer.config import SiteConfig, load_config
from bootseer.deps import jobstate, oldtree, prefixuse
from bootseer.deps.inventory import changed, inventory
from bootseer.deps.key import hash_key_files, job_image, key_inputs, scope_dir, snapshot_key
from bootseer.deps.prefix import unsafe_reason
from bootseer.errors import BootseerError, StoreError
from bootseer.progress import transfer_bar

if TYPE_CHECKING:
    from bootseer.options import Scope
    from bootseer.phases.marks import Event
    from bootseer.stepapi import Outcome


@dataclass
class RunOptions:
    prefix: str | None = None
    key_files: Sequence[str] = field(default_factory=list)
    scope: Scope = "user"
    account: str = ""


def say(msg: str) -> None:
    print(f"bootseer deps: {msg}", file=sys.stderr, flush=True)


def install_mark(event: Event, outcome: Outcome = "ok", detail: str = "", nbytes: int = 0) -> None:
    """Mark the job's ``deps_install`` phase (inside a job with phase records only)."""
    from bootseer.phases import marks

    if marks.marks_path():
        marks.mark(event, "deps_install", outcome=outcome, detail=detail, bytes=nbytes)


def skipped_phase(why: str) -> None:
    """Record that the job's install was skipped, so the report shows the saving."""
    install_mark("start")
    install_mark("end", "skipped", why)


def _job_state(cfg: SiteConfig) -> tuple[Path, jobstate.PrologState] | None:
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id or not job_id.isdigit():
        return None
    run_dir = cfg.for_node(nodepaths.node_name()).paths.run_dir
    d = jobstate.job_dir(run_dir, int(job_id))
    state = jobstate.PrologState.read(nodepaths.deps_job_state(run_dir, int(job_id)))
    return (d, state) if state is not None else None


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """One install per prefix per node: the job's other tasks wait for the first."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _check_prefix(prefix: str) -> None:
    """Refuse to install into a prefix that another user could fill or replace."""
    unsafe = unsafe_reason(prefix, os.getuid())
    if unsafe:
        raise BootseerError(
            f"refusing to install into {prefix}: {unsafe}. Use a directory of your own "
            "(e.g. under /tmp or the node's local disk)"
        )


def _install(command: Sequence[str], prefix: str) -> tuple[int, list[str], bool]:
    _check_prefix(prefix)
    before = inventory(prefix)
    env = {**os.environ, "BOOTSEER_DEPS_PREFIX": prefix}
    say(f"installing into {prefix}: {' '.join(command)}")
    install_mark("start")
    try:
        rc = subprocess.call(list(command), env=env)
    except OSError as exc:
        install_mark("end", "failed", f"cannot run {command[0]!r}: {exc.strerror}")
        raise BootseerError(f"cannot run {command[0]!r}: {exc.strerror}") from None
    # Again: another user may have made the prefix while the install ran.
    unsafe = unsafe_reason(prefix, os.getuid())
    if unsafe:
        install_mark("end", "failed", unsafe)
        raise BootseerError(f"after the install: {unsafe}; not keeping it for a snapshot")
    after = inventory(prefix)
    names = changed(before, after)
    added = sum(after[n][1] for n in names if after[n][0] == "f")
    if rc == 0:
        install_mark("end", "ok", f"{len(names)} entries", added)
    else:
        install_mark("end", "failed", f"exit {rc}", added)
    return rc, names, not before


def _other_users(prefix: str, cfg: SiteConfig | None) -> list[prefixuse.InUse]:
    """The other jobs of this user on this node that run with ``prefix``
    (:func:`bootseer.deps.prefixuse.mine_running`); none outside a Slurm job's node."""
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if cfg is None or not job_id.isdigit():
        return []
    node = nodepaths.node_name()
    return prefixuse.mine_running(
        cfg.for_node(node).paths.run_dir,
        prefix,
        int(job_id),
        node=node,
        squeue=cfg.phases.squeue,
        timeout=cfg.phases.squeue_timeout,
    )


def _discard(prefix: str) -> None:
    """Set aside a restored prefix that holds another command's snapshot: the install
    starts at once, and the job's epilog deletes the old tree (bootseer.deps.oldtree)."""
    if os.path.isdir(prefix) and not os.path.islink(prefix):
        oldtree.set_aside(prefix)


def run_install(command: Sequence[str], opts: RunOptions, cfg: SiteConfig | None = None) -> int:
    if not command:
        raise BootseerError("no install command given (put it after --)")
    cfg = cfg or load_config()
    found = _job_state(cfg)
    if found is not None:
        return _run_in_job(command, opts, *found, cfg=cfg)
    return _run_alone(command, opts, cfg)


def _run_in_job(
    command: Sequence[str],
    opts: RunOptions,
    state_dir: Path,
    state: jobstate.PrologState,
    cfg: SiteConfig | None = None,
) -> int:
    prefix = state.prefix
    if opts.prefix and opts.prefix.rstrip("/") != prefix:
        raise BootseerError(
            f"--prefix {opts.prefix} differs from the job's --bootseer-deps prefix {prefix}"
        )
    key = snapshot_key(state.base, list(command))
    user_dir = state_dir / "job"
    record_path = str(user_dir / "install.json")
    with _lock(user_dir / "install.lock"):
        rec = jobstate.read_install_record(record_path)
        if rec is not None and rec["command"] == list(command):
            if rec["status"] == 0:
                say(f"installed by another task of this job on this node; skipping ({key})")
                return 0
            status = rec["status"] if isinstance(rec["status"], int) else 1
            say(
                f"the same install failed in another task of this job on this node "
                f"(exit {status}); not running it again"
            )
            return status or 1
        if state.restored == key and os.path.isdir(prefix):
            say(f"snapshot {key} restored by the prolog; skipping the install")
            skipped_phase(f"snapshot {key} restored by the prolog")
            return 0
        users = _other_users(prefix, cfg) if state.restored else []
        if users:
            say(
                f"the restored snapshot {state.restored} was made by another command, but "
                f"{', '.join(u.describe() for u in users)} runs with it in {prefix}: not "
                "setting it aside under that job; installing into it in place (not "
                "captured; a prefix per job runs different dependencies side by side)"
            )
        elif state.restored:
            say(
                f"the restored snapshot {state.restored} was made by another command; "
                "reinstalling from scratch"
            )
            _discard(prefix)
        # First: an install that fails, or dies, must not leave an earlier record to capture.
        jobstate.clear_install_record(record_path)
        rc, names, fresh = _install(command, prefix)
        jobstate.write_install_record(
            record_path,
            {
                "command": list(command),
                "names": names if fresh else None,
                "prefix": prefix,
                "key": key,
                "fresh": fresh,
                "status": rc,
            },
        )
        if rc != 0:
            say(f"install failed (exit {rc}); nothing will be captured")
            return rc
    if fresh:
        say(f"installed {len(names)} entries; the epilog captures them as snapshot {key}")
    else:
        say(
            f"{prefix} was not empty before the install: not captured (a snapshot must "
            "restore into an empty prefix; let the command create it)"
        )
    return 0


def _run_plain(command: Sequence[str]) -> int:
    """A user's install outside a ``--bootseer-deps`` job: run as it is, nothing restored
    or captured. A user can neither check a snapshot's seal (no site key) nor write the
    store (no credentials): a restore would trust unverified bytes, a capture could not
    land. Running the command keeps the job (or the person) going the ordinary way."""
    say(
        "outside a --bootseer-deps job a user's install is neither restored nor captured "
        "(users hold no store credentials and no site key; docs/security.md): running it as is"
    )
    try:
        return subprocess.run(list(command)).returncode
    except OSError as exc:
        raise BootseerError(f"cannot run {command[0]}: {exc.strerror or exc}") from None


def _run_alone(command: Sequence[str], opts: RunOptions, cfg: SiteConfig) -> int:
    from bootseer.deps.capture import CaptureRequest, capture, snapshot_exists
    from bootseer.deps.restore import RestoreRequest, read_manifest, restore
    from bootseer.deps.step import effective_scope
    from bootseer.sitekey import keys_if_root

    if os.geteuid() != 0:
        return _run_plain(command)
    if not opts.prefix or not opts.prefix.startswith("/"):
        raise BootseerError("--prefix /ABSOLUTE/PATH is needed outside a --bootseer-deps job")
    prefix = opts.prefix.rstrip("/")
    scope, note = effective_scope(opts.scope, cfg)
    if note:
        say(note.strip())
    user = pwd.getpwuid(os.getuid()).pw_name
    sdir = scope_dir(scope, user, opts.account or os.environ.get("SLURM_JOB_ACCOUNT", ""))
    files = hash_key_files(opts.key_files, os.getcwd(), cfg.deps.max_key_file_bytes)
    inputs = key_inputs(
        scope=sdir,
        prefix=prefix,
        key_files=files,
        image=job_image(),
        python=cfg.deps.python,
    )
    base = inputs.base()
    key = snapshot_key(base, list(command))
    store = cfg.store.open()
    exists = os.path.lexists(prefix)
    # A person's own command, with the user's rights: it cannot check the site key's MAC,
    # and what it captures is not sealed, so no job's prolog will restore it (the job's
    # epilog captures anew). docs/security.md, "Authenticated records".
    keys = keys_if_root(cfg)
    try:
        found = read_manifest(
            store,
            sdir,
            key,
            max_bytes=cfg.deps.max_bytes,
            max_files=cfg.deps.max_files,
            max_frame_bytes=cfg.deps.max_frame_bytes,
            keys=keys,
        )
    except StoreError as exc:
        # A user reads no snapshot from a store that keeps them root's (file:// stores
        # do; docs/security.md, "Store secrets"): install instead.
        say(f"cannot read snapshots from the store: {exc}; installing")
        found = None
    if found is not None and not exists:
        manifest, _ = found
        with transfer_bar("restoring", manifest.stored_bytes) as tick:
            done = restore(
                store,
                manifest,
                RestoreRequest(
                    prefix=prefix,
                    uid=os.getuid(),
                    gid=os.getgid(),
                    groups=os.getgroups(),
                    link_roots=cfg.deps.link_roots,
                    max_bytes=cfg.deps.max_bytes,
                    max_files=cfg.deps.max_files,
                    max_frame_bytes=cfg.deps.max_frame_bytes,
                    threads=cfg.deps.threads,
                ),
                progress=tick,
            )
        say(f"restored snapshot {key} into {prefix} ({done.entries} entries); install skipped")
        return 0
    parent = os.path.dirname(prefix)
    os.makedirs(parent, exist_ok=True)
    with _lock(Path(parent) / f".{os.path.basename(prefix)}.bootseer-lock"):
        rc, names, fresh = _install(command, prefix)
    if rc != 0:
        say(f"install failed (exit {rc}); nothing captured")
        return rc
    if not fresh:
        say(f"{prefix} was not empty before the install: not captured")
        return 0
    try:
        if snapshot_exists(store, sdir, key, keys=keys):
            say(f"snapshot {key} is already in the store")
            return 0
    except StoreError as exc:
        say(f"install done, but not captured: {exc}")
        return 0
    req = CaptureRequest(
        prefix=prefix,
        scope=sdir,
        base=base,
        key=key,
        uid=os.getuid(),
        gid=os.getgid(),
        groups=os.getgroups(),
        names=names,
        command=list(command),
        inputs=inputs.describe(),
        user=user,
        node=os.uname().nodename,
        frame_bytes=cfg.deps.frame_bytes,
        level=cfg.deps.level,
        threads=cfg.deps.threads,
        max_bytes=cfg.deps.max_bytes,
        max_files=cfg.deps.max_files,
    )
    try:
        with transfer_bar("capturing", None) as tick:
            m = capture(store, req, progress=lambda raw, stored: tick(0, raw), keys=keys)
    except BootseerError as exc:
        say(f"install done, but the capture failed: {exc}")
        return 0
    say(
        f"captured snapshot {key}: {len(m.entries)} entries, {m.raw_bytes} bytes "
        f"-> {m.stored_bytes} in the store"
    )
    return 0
