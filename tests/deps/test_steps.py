"""The prolog and epilog steps end to end on a file store (no Slurm): capture after an
install, restore on the next run, one restore per node, scopes kept apart."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer.deps import jobstate, step
from bootseer.deps.archive import walk_prefix
from bootseer.deps.capture import CaptureRequest, capture
from bootseer.deps.layout import ref_path
from bootseer.deps.manifest import Manifest
from bootseer.deps.restore import RestoreRequest, find_snapshot, read_manifest, restore
from bootseer.errors import StepError
from bootseer.sitekey import DEPS_MANIFEST, DEPS_REF
from bootseer.store import Store
from tests.sitekeys import KEYS

from .conftest import USER_A, USER_B, fake_squeue, needs_root, site, step_call

pytestmark = pytest.mark.root

TOP = Path(__file__).resolve().parents[2]


def fill(prefix: Path, uid: int) -> None:
    """What an install leaves: a tree owned by the job's user."""
    (prefix / "lib" / "pkg").mkdir(parents=True)
    (prefix / "lib" / "pkg" / "mod.py").write_text("X = 1\n")
    (prefix / "lib" / "pkg" / "data.bin").write_bytes(os.urandom(200_000))
    (prefix / "bin").mkdir()
    (prefix / "bin" / "tool").write_text("#!/bin/sh\necho hi\n")
    os.chmod(prefix / "bin" / "tool", 0o755)
    for p in [prefix, *prefix.rglob("*")]:
        os.chown(p, uid, uid, follow_symlinks=False)


def captured_elsewhere(scratch: Path, store: Store) -> Manifest:
    """A snapshot of USER_A's filled ``scratch/src``, its manifest pointed at
    ``scratch/env`` to restore it elsewhere."""
    src = scratch / "src"
    src.mkdir()
    fill(src, USER_A)
    req = CaptureRequest(
        prefix=str(src), scope="user/ada", base="1" * 32, key="2" * 32, uid=USER_A, gid=USER_A
    )
    m = capture(store, req, keys=KEYS)
    m.prefix = str(scratch / "env")
    return m


def installed(call, prefix: Path) -> None:  # type: ignore[no-untyped-def]
    """What ``bootseer deps run`` leaves after an install into an empty ``prefix``: the
    tree (``fill``) and the job's install record naming what it added."""
    fill(prefix, call.ctx.uid)
    job = call.job.sub("deps") / "job"
    record = str(job / "install.json")
    jobstate.write_install_record(
        record,
        {
            "command": ["pip", "install"],
            "names": walk_prefix(str(prefix)),
            "prefix": str(prefix),
            "fresh": True,
            "status": 0,
        },
    )
    os.chown(record, call.ctx.uid, call.ctx.gid)


def deps_run_in_job(scratch: Path, call, command: list[str]) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    """``bootseer deps run`` as the job's task would run it, as the job's user."""
    cfg_path = scratch / "site.toml"
    env = {
        "PATH": "/usr/bin:/bin",
        "SLURM_JOB_ID": str(call.ctx.job_id),
        "SLURMD_NODENAME": call.ctx.node,
        "BOOTSEER_CONFIG": str(cfg_path),
        "PYTHONPATH": str(TOP / "lib"),
    }
    # As root: another uid may not be able to run this interpreter (it may live under /root).
    assert call.ctx.uid == 0
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from bootseer.cli import main; sys.exit(main(sys.argv[1:]))",
            "deps",
            "run",
            "--",
            *command,
        ],
        env=env,
        capture_output=True,
        text=True,
        cwd=scratch,
    )


def write_site(scratch: Path, **deps: object) -> None:
    lines = [
        f'[store]\nuri = "file://{scratch}/store"\n',
        f'[paths]\nrun_dir = "{scratch}/run/%n"\ncache_dir = "{scratch}/cache/%n"\n'
        f'log_dir = "{scratch}/log"\n',
        '[deps]\npython = "/bin/false"\n',
    ]
    lines += [f"{k} = {json.dumps(v)}\n" for k, v in deps.items()]
    # deps run asks Slurm before it sets a restored tree aside (bootseer.deps.prefixuse)
    lines.append(f'[phases]\nsqueue = "{fake_squeue(scratch)}"\n')
    (scratch / "site.toml").write_text("".join(lines))


def test_first_run_captures_second_run_restores(scratch: Path) -> None:
    needs_root()
    cfg = site(scratch)
    (scratch / "req.txt").write_text("numpy\n")
    prefix = scratch / "env"
    spec = f"{prefix},key=req.txt"

    first = step_call(scratch, cfg, job_id=1, uid=USER_A, user="ada", deps=spec)
    r = step.prolog(first)
    assert r.outcome == "skipped" and "no snapshot" in r.detail
    installed(first, prefix)
    r = step.epilog(first)
    assert r.outcome == "ok" and "captured" in r.detail and r.bytes > 0

    import shutil

    shutil.rmtree(prefix)
    second = step_call(
        scratch, cfg, job_id=2, uid=USER_A, user="ada", deps=spec, node="n2", nodes=("n2",)
    )
    r = step.prolog(second)
    assert r.outcome == "ok" and "restored" in r.detail, r.detail
    assert r.bytes > 200_000 * 0.9
    assert r.env["BOOTSEER_DEPS_KEY"]
    assert (prefix / "bin" / "tool").stat().st_uid == USER_A
    assert os.access(prefix / "bin" / "tool", os.X_OK)

    third = step_call(
        scratch, cfg, job_id=3, uid=USER_A, user="ada", deps=spec, node="n2", nodes=("n2",)
    )
    r = step.prolog(third)
    assert "already" in r.detail and r.bytes < 10_000  # the manifest only
    assert step.epilog(third).outcome == "skipped"


def test_deps_run_skips_after_a_restore_and_the_epilog_captures_what_it_added(
    scratch: Path,
) -> None:
    needs_root()
    write_site(scratch)
    cfg = site(scratch)
    (scratch / "req.txt").write_text("x\n")
    os.chmod(scratch / "req.txt", 0o644)
    prefix = scratch / "env"
    spec = f"{prefix},key=req.txt"
    install = ["sh", "-c", f"mkdir -p {prefix}/lib && echo v1 > {prefix}/lib/a.py"]

    first = step_call(scratch, cfg, job_id=11, uid=0, user="root", deps=spec)
    step.prolog(first)
    out = deps_run_in_job(scratch, first, install)
    assert out.returncode == 0, out.stderr
    assert "the epilog captures" in out.stderr
    (prefix / "lib" / "later.log").write_text("written by training, after the install\n")
    r = step.epilog(first)
    assert "captured" in r.detail, r.detail

    import shutil

    shutil.rmtree(prefix)
    second = step_call(scratch, cfg, job_id=12, uid=0, user="root", deps=spec)
    assert "restored" in step.prolog(second).detail
    assert (prefix / "lib" / "a.py").read_text() == "v1\n"
    assert not (prefix / "lib" / "later.log").exists()
    out = deps_run_in_job(scratch, second, install)
    assert out.returncode == 0 and "skipping the install" in out.stderr, out.stderr
    assert step.epilog(second).outcome == "skipped"

    changed = ["sh", "-c", f"mkdir -p {prefix}/lib && echo v2 > {prefix}/lib/a.py"]
    out = deps_run_in_job(scratch, second, changed)
    assert "reinstalling" in out.stderr, out.stderr
    assert (prefix / "lib" / "a.py").read_text() == "v2\n"
    # The restored tree was set aside, not deleted in the job: its epilog deletes it.
    (old,) = scratch.glob(".env.bootseer-old-*")
    assert (old / "env" / "lib" / "a.py").read_text() == "v1\n"
    assert "deleted 1 old trees" in step.epilog(second).detail
    assert not list(scratch.glob(".env.bootseer-old-*"))


def test_user_b_never_gets_user_a_snapshot(scratch: Path) -> None:
    needs_root()
    cfg = site(scratch)
    (scratch / "req.txt").write_text("same\n")
    os.chmod(scratch / "req.txt", 0o644)
    prefix = scratch / "env"
    spec = f"{prefix},key=req.txt,scope=cluster"  # asks to share; the site does not allow it
    a = step_call(scratch, cfg, job_id=21, uid=USER_A, user="ada", deps=spec)
    step.prolog(a)
    installed(a, prefix)
    assert "captured" in step.epilog(a).detail
    import shutil

    shutil.rmtree(prefix)
    b = step_call(scratch, cfg, job_id=22, uid=USER_B, user="bob", deps=spec)
    r = step.prolog(b)
    assert r.outcome == "skipped" and "not allowed" in r.detail and "user/bob" in r.detail
    assert not prefix.exists()

    shared = site(scratch, scopes=["user", "cluster"])
    a = step_call(scratch, shared, job_id=23, uid=USER_A, user="ada", deps=spec)
    step.prolog(a)
    installed(a, prefix)
    step.epilog(a)
    shutil.rmtree(prefix)
    b = step_call(scratch, shared, job_id=24, uid=USER_B, user="bob", deps=spec)
    assert "restored" in step.prolog(b).detail
    assert (prefix / "bin" / "tool").stat().st_uid == USER_B


def test_many_jobs_on_one_node_restore_once(scratch: Path) -> None:
    needs_root()
    cfg = site(scratch)
    prefix = scratch / "env"
    first = step_call(scratch, cfg, job_id=31, uid=USER_A, user="ada", deps=str(prefix))
    step.prolog(first)
    installed(first, prefix)
    step.epilog(first)
    import shutil

    shutil.rmtree(prefix)
    calls = [
        step_call(scratch, cfg, job_id=40 + i, uid=USER_A, user="ada", deps=str(prefix))
        for i in range(4)
    ]
    with cf.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(step.prolog, calls))
    restored = [r for r in results if r.detail.startswith("restored")]
    already = [r for r in results if "already" in r.detail]
    assert (len(restored), len(already)) == (1, 3), [r.detail for r in results]


def test_two_jobs_capturing_the_same_key_leave_one_good_snapshot(
    store: Store, scratch: Path
) -> None:
    needs_root()
    prefix = scratch / "env"
    prefix.mkdir()
    fill(prefix, USER_A)
    req = CaptureRequest(
        prefix=str(prefix),
        scope="user/ada",
        base="1" * 32,
        key="2" * 32,
        uid=USER_A,
        gid=USER_A,
        frame_bytes=1 << 16,
    )
    with cf.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda _: capture(store, req, keys=KEYS), range(2)))
    key = find_snapshot(store, "user/ada", "1" * 32, keys=KEYS)
    assert key == "2" * 32
    m, _ = read_manifest(store, "user/ada", key, max_bytes=1 << 30, max_files=100, keys=KEYS)  # type: ignore[misc]
    os.rename(prefix, scratch / "old")
    restore(store, m, RestoreRequest(prefix=str(prefix), uid=USER_A, gid=USER_A))
    assert (prefix / "lib" / "pkg" / "data.bin").read_bytes() == (
        scratch / "old" / "lib" / "pkg" / "data.bin"
    ).read_bytes()


def test_a_prefix_bootseer_did_not_make_is_left_alone(scratch: Path) -> None:
    needs_root()
    cfg = site(scratch)
    prefix = scratch / "env"
    a = step_call(scratch, cfg, job_id=51, uid=USER_A, user="ada", deps=str(prefix))
    step.prolog(a)
    installed(a, prefix)
    assert "captured" in step.epilog(a).detail
    # Made anew by hand: another directory than the one the epilog stamped (the old one
    # kept meanwhile, so the new one cannot get its inode number).
    os.rename(prefix, scratch / "old-env")
    fill(prefix, USER_A)
    b = step_call(scratch, cfg, job_id=52, uid=USER_A, user="ada", deps=str(prefix))
    with pytest.raises(StepError, match="not restored by bootseer"):
        step.prolog(b)
    assert (prefix / "lib" / "pkg" / "mod.py").exists()


def test_the_epilog_captures_only_what_deps_run_installed(scratch: Path) -> None:
    """A job naming a directory it never installed into (/usr/share/doc) gets nothing of
    it into the store."""
    needs_root()
    cfg = site(scratch)
    prefix = scratch / "env"
    fill(prefix, USER_A)  # there, but not by `bootseer deps run`
    a = step_call(scratch, cfg, job_id=61, uid=USER_A, user="ada", deps=str(prefix))
    step.prolog(a)
    r = step.epilog(a)
    assert r.outcome == "skipped" and "nothing installed" in r.detail, r.detail
    doc = step_call(scratch, cfg, job_id=62, uid=0, user="root", deps="/usr/share/doc")
    step.prolog(doc)
    r = step.epilog(doc)
    assert r.outcome == "skipped" and "nothing installed" in r.detail, r.detail
    assert not list((scratch / "store").rglob("manifest*"))


def test_a_prefix_another_user_made_first_is_refused(scratch: Path) -> None:
    """Mallory creates ada's predictable node-local prefix first, empty and world-writable:
    the prolog refuses it (no restore into it), and so do deps run and the epilog."""
    needs_root()
    write_site(scratch)
    cfg = site(scratch)
    prefix = scratch / "env"
    prefix.mkdir()
    os.chown(prefix, USER_B, USER_B)
    os.chmod(prefix, 0o777)
    a = step_call(scratch, cfg, job_id=71, uid=USER_A, user="ada", deps=str(prefix))
    with pytest.raises(StepError, match="belongs to uid 4343, not the job's user"):
        step.prolog(a)
    # The prolog's state is there, so the epilog runs; it refuses to capture.
    installed(a, prefix)
    with pytest.raises(StepError, match="not capturing"):
        step.epilog(a)
    assert not list((scratch / "store").rglob("manifest*"))


@pytest.mark.parametrize(
    ("parent_owner", "mode", "needle"),
    [
        (0, 0o777, "writable by other users without the sticky bit"),
        (USER_B, 0o755, "belongs to uid 4343"),
    ],
)
def test_a_prefix_under_a_directory_others_can_change_is_refused(
    scratch: Path, parent_owner: int, mode: int, needle: str
) -> None:
    needs_root()
    cfg = site(scratch)
    parent = scratch / "shared"
    parent.mkdir()
    os.chown(parent, parent_owner, parent_owner)
    os.chmod(parent, mode)
    a = step_call(scratch, cfg, job_id=81, uid=USER_A, user="ada", deps=str(parent / "env"))
    with pytest.raises(StepError, match=needle):
        step.prolog(a)


def test_deps_run_refuses_a_prefix_of_another_user(scratch: Path) -> None:
    needs_root()
    write_site(scratch)
    cfg = site(scratch)
    prefix = scratch / "env"
    call = step_call(scratch, cfg, job_id=91, uid=0, user="root", deps=str(prefix))
    step.prolog(call)
    prefix.mkdir()  # made by another user after the prolog looked
    os.chown(prefix, USER_B, USER_B)
    os.chmod(prefix, 0o777)
    out = deps_run_in_job(scratch, call, ["sh", "-c", f"touch {prefix}/x"])
    assert out.returncode != 0 and "refusing to install into" in out.stderr, out.stderr
    assert not (prefix / "x").exists()
    assert step.epilog(call).outcome == "skipped"


def test_a_failed_install_is_never_captured(scratch: Path) -> None:
    needs_root()
    write_site(scratch)
    cfg = site(scratch)
    (scratch / "req.txt").write_text("x\n")
    prefix = scratch / "env"
    spec = f"{prefix},key=req.txt"
    call = step_call(scratch, cfg, job_id=51, uid=0, user="root", deps=spec)
    step.prolog(call)
    good = ["sh", "-c", f"mkdir -p {prefix}/lib && echo ok > {prefix}/lib/a.py"]
    assert deps_run_in_job(scratch, call, good).returncode == 0
    # A second install fails half-way (a full disk, a bad package): it changed the prefix.
    bad = ["sh", "-c", f"echo half > {prefix}/lib/b.py; exit 3"]
    out = deps_run_in_job(scratch, call, bad)
    assert out.returncode == 3 and "nothing will be captured" in out.stderr, out.stderr
    r = step.epilog(call)
    assert r.outcome == "skipped" and "failed (exit 3)" in r.detail, r.detail
    store = cfg.store.open()
    assert not store.list("deps", recursive=True)

    # In a fresh job, an install that fails from the start: nothing either, and a task
    # of the same job asking for the same install gets the same failure, not a skip.
    import shutil

    shutil.rmtree(prefix)
    call = step_call(scratch, cfg, job_id=52, uid=0, user="root", deps=spec)
    step.prolog(call)
    half = ["sh", "-c", f"mkdir -p {prefix} && echo half > {prefix}/x; exit 2"]
    assert deps_run_in_job(scratch, call, half).returncode == 2
    again = deps_run_in_job(scratch, call, half)
    assert again.returncode == 2 and "failed in another task" in again.stderr, again.stderr
    assert "failed (exit 2)" in step.epilog(call).detail
    assert not store.list("deps", recursive=True)


def test_a_broken_snapshot_is_dropped_and_replaced(scratch: Path) -> None:
    needs_root()
    cfg = site(scratch)
    (scratch / "req.txt").write_text("numpy\n")
    prefix = scratch / "env"
    spec = f"{prefix},key=req.txt"
    first = step_call(scratch, cfg, job_id=61, uid=USER_A, user="ada", deps=spec)
    step.prolog(first)
    installed(first, prefix)
    assert "captured" in step.epilog(first).detail
    store = cfg.store.open()
    (data,) = [o.key for o in store.list("deps", recursive=True) if ".tar.zst" in o.key]
    raw = bytearray(store.read_bytes(data))
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte in the store's archive
    store.write_bytes(data, bytes(raw))

    import shutil

    shutil.rmtree(prefix)
    second = step_call(scratch, cfg, job_id=62, uid=USER_A, user="ada", deps=spec)
    with pytest.raises(StepError, match=r"broken.*dropped it from the store"):
        step.prolog(second)
    assert not prefix.exists()
    assert not [p for p in scratch.iterdir() if p.name.startswith(".env.bootseer-")]
    state = jobstate.PrologState.read(second.job.sub("deps") / "prolog.json")
    assert state is not None
    assert find_snapshot(store, state.scope, state.base, keys=KEYS) is None  # not offered again
    installed(second, prefix)  # the job installs; its epilog captures anew
    assert "captured" in step.epilog(second).detail

    shutil.rmtree(prefix)
    third = step_call(scratch, cfg, job_id=63, uid=USER_A, user="ada", deps=spec)
    r = step.prolog(third)
    assert r.outcome == "ok" and "restored" in r.detail, r.detail
    assert (prefix / "bin" / "tool").read_text() == "#!/bin/sh\necho hi\n"


def test_a_manifest_that_does_not_parse_is_dropped(scratch: Path) -> None:
    needs_root()
    cfg = site(scratch)
    (scratch / "req.txt").write_text("numpy\n")
    prefix = scratch / "env"
    spec = f"{prefix},key=req.txt"
    first = step_call(scratch, cfg, job_id=71, uid=USER_A, user="ada", deps=spec)
    step.prolog(first)
    installed(first, prefix)
    step.epilog(first)
    store = cfg.store.open()
    (manifest,) = [o.key for o in store.list("deps", recursive=True) if "manifest" in o.key]
    # Sealed (as by a buggy root-run writer): an unsealed one is refused before parsing,
    # not dropped (tests/deps/test_sealed.py).
    store.write_bytes(manifest, KEYS.seal(DEPS_MANIFEST, manifest, b"{not json}"))
    import shutil

    shutil.rmtree(prefix)
    second = step_call(scratch, cfg, job_id=72, uid=USER_A, user="ada", deps=spec)
    with pytest.raises(StepError, match="broken"):
        step.prolog(second)
    assert not store.exists(manifest)
    r = step.prolog(step_call(scratch, cfg, job_id=73, uid=USER_A, user="ada", deps=spec))
    assert r.outcome == "skipped" and "no snapshot" in r.detail

    assert not [o for o in store.list("deps", recursive=True) if "/refs/" in o.key]
    state = jobstate.PrologState.read(second.job.sub("deps") / "prolog.json")
    assert state is not None
    ref = ref_path(state.scope, state.base)
    store.write_bytes(ref, KEYS.seal(DEPS_REF, ref, b"{[}"))  # a ref that does not parse goes too
    with pytest.raises(StepError, match=r"the ref of base .* is broken.*dropped"):
        step.prolog(step_call(scratch, cfg, job_id=74, uid=USER_A, user="ada", deps=spec))
    assert not store.exists(ref)


def test_a_restore_past_its_deadline_leaves_no_temporary_directory(
    scratch: Path, store: Store
) -> None:
    needs_root()
    m = captured_elsewhere(scratch, store)
    import threading

    hung = threading.Event()

    def via(key: str, offset: int, length: int, sha: str) -> None:
        hung.wait(3)  # the store (or the peers) hang past the restore's deadline
        return None

    req = RestoreRequest(prefix=str(scratch / "env"), uid=USER_A, gid=USER_A, timeout=1.0)
    with pytest.raises(StepError):
        restore(store, m, req, via=via)
    assert not (scratch / "env").exists()
    left = [p.name for p in scratch.iterdir() if p.name.startswith(".env.bootseer-")]
    assert not left
