"""Every ``bootseer`` command that changes what others rely on is an admin's: run as a
user it is refused before anything is read or written, in one line that says to run it
as root; run as root it works. And a user's ``deps run`` outside a ``--bootseer-deps``
job runs the install as it is: it restores nothing (a user cannot check a seal) and
captures nothing (a user cannot write the store). Issue 11."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("mksquashfs"),
        reason="needs root, setpriv and squashfs-tools",
    ),
]

BOOTSEER = str(Path(sys.executable).parent / "bootseer")


@pytest.fixture
def site() -> Iterator[Path]:
    """A site config (store, checkpoint target, site key) in a directory users may enter."""
    try:
        pwd.getpwnam("alice")
    except KeyError:
        pytest.skip("needs slurm-dev's user alice")
    d = Path(tempfile.mkdtemp(prefix="bootseer-admin-", dir="/var/tmp"))
    d.chmod(0o755)
    key = d / "site.key"
    key.write_text(os.urandom(32).hex() + "\n")
    key.chmod(0o600)
    for root in ("store", "t1"):  # the site makes the stores' roots, never bootseer
        (d / root).mkdir()
    config = d / "config.toml"
    config.write_text(
        f'[site]\nkey_file = "{key}"\n[store]\nuri = "file://{d}/store"\n'
        f'[ckpt]\ntargets = ["file://{d}/t1"]\n'
    )
    config.chmod(0o644)
    try:
        yield config
    finally:
        shutil.rmtree(d)


def run(config: Path, user: str, *argv: str) -> subprocess.CompletedProcess[str]:
    who = [] if user == "root" else ["setpriv", f"--reuid={user}", f"--regid={user}"]
    return subprocess.run(
        [
            *who,
            *(["--init-groups"] if who else []),
            "env",
            "-u",
            "SLURM_JOB_ID",
            f"BOOTSEER_CONFIG={config}",
            BOOTSEER,
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )


ADMIN = [
    ["ckpt", "gc", "proj"],
    ["deps", "gc", "--dry-run"],
    ["deps", "rm", "0" * 64],
    ["image", "rm", "shared:1"],
    ["image", "gc", "--dry-run"],
    ["phase", "compact"],
]


def test_admin_actions_are_refused_to_users_in_one_line_and_work_for_root(site: Path) -> None:
    image = site.parent / "img.sqsh"
    src = site.parent / "img"
    src.mkdir()
    (src / "hello").write_text("hello\n")
    subprocess.run(["mksquashfs", str(src), str(image), "-quiet", "-noappend"], check=True)
    image.chmod(0o644)
    r = run(site, "root", "image", "add", str(image), "--name", "shared:1")
    assert r.returncode == 0, r.stderr
    # registering a name (shared by every user) needs the site key: root's
    r = run(site, "alice", "image", "add", str(image), "--name", "shared:1")
    assert r.returncode == 1 and "run it as root" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    for argv in ADMIN:
        r = run(site, "alice", *argv)
        assert r.returncode == 1, (argv, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "is an admin action" in lines[0], (argv, r.stderr)
        assert "run it as root" in lines[0] and not r.stdout, (argv, r.stdout)
    r = run(site, "root", "image", "ls")
    assert "shared" in r.stdout, r.stdout + r.stderr  # alice's rm removed nothing
    for argv in ADMIN:
        r = run(site, "root", *argv)
        missing = argv[:2] == ["deps", "rm"]  # no such snapshot: refused for that reason
        assert (r.returncode == 1) == missing, (argv, r.stdout, r.stderr)
        assert "admin action" not in r.stderr, (argv, r.stderr)


def test_image_gc_fails_and_deletes_no_block_when_a_manifest_in_use_is_unreadable(
    site: Path,
) -> None:
    image = site.parent / "img.sqsh"
    src = site.parent / "img"
    src.mkdir()
    (src / "hello").write_text("hello\n")
    subprocess.run(["mksquashfs", str(src), str(image), "-quiet", "-noappend"], check=True)
    r = run(site, "root", "image", "add", str(image), "--name", "shared:1")
    assert r.returncode == 0, r.stderr
    store = site.parent / "store"
    (manifest,) = (store / "images" / "manifests").iterdir()
    manifest.write_bytes(b"{}")  # damaged, or a format of a later release
    blocks = sorted((store / "images" / "blocks").rglob("*"))
    r = run(site, "root", "image", "gc", "--grace", "0s")
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"cannot read the manifest of image {manifest.stem}" in r.stderr, r.stderr
    assert "kept every block" in r.stderr and "deleted 0 manifests" in r.stdout, r.stdout
    assert sorted((store / "images" / "blocks").rglob("*")) == blocks


def test_a_users_deps_run_outside_a_job_restores_nothing_and_captures_nothing(
    site: Path,
) -> None:
    """root captured a snapshot for this prefix and command; the store is readable by
    everyone (as an S3 store with anonymous read is). alice's `deps run` outside a job
    used to restore it, unverified (she has no key to check its seal); now it runs her
    install, and writes nothing to the store."""
    top = site.parent / "prefixes"
    top.mkdir(mode=0o1777)
    top.chmod(0o1777)
    prefix = top / "venv"
    cmd = ["--", "sh", "-c", f"mkdir -p {prefix} && echo installed-by-$(id -un) > {prefix}/who"]
    r = run(site, "root", "deps", "run", "--prefix", str(prefix), *cmd)
    assert r.returncode == 0, r.stderr
    assert (prefix / "who").read_text() == "installed-by-root\n"
    shutil.rmtree(prefix)
    store = site.parent / "store"
    subprocess.run(["chmod", "-R", "a+rX", str(store)], check=True)
    before = sorted(p for p in store.rglob("*"))
    r = run(site, "alice", "deps", "run", "--prefix", str(prefix), *cmd)
    assert r.returncode == 0, r.stderr
    assert (prefix / "who").read_text() == "installed-by-alice\n"  # ran, not restored
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "neither restored nor captured" in lines[0], r.stderr
    assert sorted(p for p in store.rglob("*")) == before
    # Her command's status is hers.
    r = run(site, "alice", "deps", "run", "--", "sh", "-c", "exit 3")
    assert r.returncode == 3, r.stderr
