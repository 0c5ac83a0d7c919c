"""The store: it is there, users reach only the public phase records, Slurm's privacy
matches the records', and the node's clock agrees with the store's."""

from __future__ import annotations

import contextlib
import os
import stat
import time
import uuid

from bootseer.doctor.node import Node, needs_config
from bootseer.doctor.result import Check, ok, problem, skip
from bootseer.errors import BootseerError

CLOCK_SKEW = 5.0  # seconds between this node and the store's time that we tolerate


@needs_config("store")
def check_store(node: Node) -> Check:
    """The store is there (never created by looking) and, where it can tell, users
    cannot write it."""
    name = "store"
    assert node.cfg is not None
    uri = node.cfg.store.uri
    try:
        store = node.store
    except BootseerError as exc:
        return problem(
            name, str(exc), f"mount or create it, or fix store.uri in {node.config_path}"
        )
    if not store.is_local:
        return ok(name, f"{uri} answers")
    mode = stat.S_IMODE(os.stat(store.root).st_mode)
    if mode & 0o002:
        return problem(
            name,
            f"{store.root}: mode {mode:04o}: every user can write the store",
            f"chmod o-w {store.root} (users' records are refused, but they may delete)",
        )
    return ok(name, f"{uri} (mode {mode:04o})")


@needs_config("store exposure")
def check_store_exposure(node: Node) -> Check:
    """Without credentials, users reach the public phase records and nothing else: no
    snapshot, image record or block, no listing of them, no write; and no port of the
    store host but its S3 gateway accepts a connection from here (docs/security.md)."""
    name = "store exposure"
    assert node.cfg is not None
    try:
        store = node.store
    except BootseerError:
        return skip(name, "no store to probe")
    from bootseer.store.exposure import exposure
    from bootseer.store.sidedoors import side_doors

    doors = side_doors(store.uri)
    if doors:
        ports = ", ".join(str(d.port) for d in doors)
        return problem(
            name,
            "; ".join(str(d) for d in doors),
            f"bind port {ports} of the store host to its loopback or a network no user "
            "reaches, or refuse it there (docs/security.md, 'Side doors')",
        )
    found = exposure(store)
    if not found:
        who = "the anonymous identity" if not store.is_local else "other users"
        return ok(name, f"{who} reach phases/ only")
    fix = (
        f"chmod -R go-rwx the private tops of {store.root} (all but phases/)"
        if store.is_local
        else "give the anonymous identity read and list on <root>/phases/* only "
        "(docs/security.md, Who reads the store on S3)"
    )
    return problem(name, "; ".join(found), fix)


@needs_config("phase records")
def check_phase_privacy(node: Node) -> Check:
    """Phase records are public ([store] public_phases) only where Slurm shows every
    user's jobs to everyone: with ``PrivateData=jobs``, ``bootseer report`` must not show
    mallory alice's jobs, their failures and script paths (docs/security.md)."""
    name = "phase records"
    assert node.cfg is not None
    private = {p.strip().lower() for p in node.slurm.get("privatedata", "").split(",")}
    public = node.cfg.store.public_phases
    if "jobs" in private and public:
        return problem(
            name,
            f"Slurm keeps jobs private ({node.slurm_conf}: PrivateData="
            f"{node.slurm.get('privatedata')}), but [store] public_phases = true: every user "
            "reads every job's phase records (user, nodes, times, script path, why steps "
            "failed) with bootseer report",
            "set [store] public_phases = false in the site config (users then run "
            "bootseer report as root; docs/security.md, 'Who reads the store on S3')",
        )
    if public:
        return ok(name, "public: Slurm shows every user's jobs to everyone too")
    return ok(name, "private to root ([store] public_phases = false)")


@needs_config("clock")
def check_clock(node: Node) -> Check:
    """This node's clock against the store's (the time it stamps a new object with)."""
    name = "clock"
    try:
        store = node.store
    except BootseerError:
        return skip(name, "no store to compare with")
    key = f".tmp-doctor-{uuid.uuid4().hex}"
    try:
        before = time.time()
        store.write_bytes(key, b"", atomic=False)
        info = store.info(key)
        after = time.time()
    except (BootseerError, OSError) as exc:
        return skip(name, f"cannot stamp an object in the store ({type(exc).__name__})")
    finally:
        with contextlib.suppress(BootseerError, OSError):
            store.delete(key)
    if info is None or not info.mtime:
        return skip(name, "the store gives no modification times")
    # S3 stamps whole seconds: allow for that and the round trip.
    skew = max(info.mtime - after, before - 1 - info.mtime, 0.0)
    if skew > CLOCK_SKEW:
        return problem(
            name,
            f"{skew:.0f}s apart from the store's clock",
            "run chrony or systemd-timesyncd against the site's time source",
        )
    return ok(name, f"within {CLOCK_SKEW:g}s of the store's")
