"""On the slurm-dev cluster, as an ordinary user: a restore killed mid-extract leaves its
extraction dir beside the prefix, and the next epilog of the prefix deletes it (another
user's stays); a job whose key files give another snapshot than the one a running job of
the user has in the node's prefix is refused the restore while that job runs (its tree
stays whole, the refused job's stderr says why) and restores once it ended."""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

import pytest

from tests.conftest import DevSlurm, devcluster
from tests.deps.test_slurm import deps_line
from tests.waiting import wait_until

pytestmark = pytest.mark.slurm

PREFIX = devcluster.NODE_LOCAL / "deps-prefixuse"
EXTRACTION = f".{PREFIX.name}.bootseer-"
HOLDER = f".{PREFIX.name}.bootseer-old-"


def on_host(cluster: DevSlurm, node: str) -> Path:
    """The node's local directory (the prefix's parent), as the host sees it."""
    return cluster.dir / "nodes" / node / "local"


def fresh(cluster: DevSlurm, node: str, name: str) -> tuple[Path, Path]:
    """A work dir for the jobs' key file, and the node's local dir without the prefix."""
    work = cluster.dir / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    work.chmod(0o777)
    local = on_host(cluster, node)
    for left in local.glob(f".{PREFIX.name}.*"):
        shutil.rmtree(left)
    shutil.rmtree(local / PREFIX.name, ignore_errors=True)
    return work, local


def install(work: Path, more: str = "") -> str:
    """The job's install: the key file's content into the prefix (``more``: a command of
    another snapshot key, for the same key files)."""
    return (
        f"bootseer deps run -- sh -c 'mkdir -p {PREFIX}/lib && "
        f"cp {work}/req.txt {PREFIX}/lib/installed.txt{more}'\n"
        f"cat {PREFIX}/lib/installed.txt\n"
    )


def submit(cluster: DevSlurm, node: str, work: Path, body: str) -> int:
    return cluster.sbatch(
        "-w",
        node,
        "-n1",
        f"--bootseer-deps={PREFIX},key={work}/req.txt",
        script=f"#!/bin/sh\n{body}",
    )


def test_a_killed_restores_extraction_dir_goes_with_the_next_epilog(cluster: DevSlurm) -> None:
    node = cluster.nodes[1]
    work, local = fresh(cluster, node, "deps-prefixuse-kill")
    (work / "req.txt").write_text("v1\n")
    bob = pwd.getpwnam("bob")
    others = [local / f"{EXTRACTION}0therusr", local / f"{HOLDER}0therusr"]
    for d in others:
        (d / "lib").mkdir(parents=True)
        for p in (d, d / "lib"):
            os.chown(p, bob.pw_uid, bob.pw_gid)
    killed = f"{PREFIX.parent}/{EXTRACTION}k1lled00"  # what a SIGKILLed extraction left
    jid = submit(
        cluster,
        node,
        work,
        f"mkdir -p {killed}/lib && head -c 65536 /dev/zero > {killed}/lib/big.so\n"
        f"ls -a {PREFIX.parent} | grep -F '{EXTRACTION}' | sed 's/^/beside: /'\n",
    )
    assert cluster.wait(jid) == "COMPLETED", cluster.output(jid)
    assert cluster.output(jid).count("beside: ") == 3, cluster.output(jid)
    line = deps_line(cluster, node, jid, "epilog")
    assert "1 extraction dirs of killed restores set aside" in line, line
    assert "deleted 1 old trees" in line and "(1 left)" in line, line
    assert not (local / f"{EXTRACTION}k1lled00").exists()
    assert all((d / "lib").is_dir() for d in others)


def test_no_restore_replaces_the_prefix_of_a_running_job(cluster: DevSlurm) -> None:
    node = cluster.nodes[2]
    work, local = fresh(cluster, node, "deps-prefixuse-run")
    for v in ("v1", "v2"):  # both snapshots in the store; the node's prefix holds v2
        shutil.rmtree(local / PREFIX.name, ignore_errors=True)
        (work / "req.txt").write_text(f"{v}\n")
        jid = submit(cluster, node, work, install(work))
        assert cluster.wait(jid) == "COMPLETED", cluster.output(jid)
        assert "captured" in deps_line(cluster, node, jid, "epilog")

    go = work / "go"
    a = submit(
        cluster,
        node,
        work,
        install(work) + f"i=0; while [ ! -e {go} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); "
        f"done\necho after: $(cat {PREFIX}/lib/installed.txt)\n",
    )
    out = cluster.dir / "out" / f"{a}.out"
    wait_until(lambda: out.exists() and "v2" in out.read_text(), f"job {a} running", timeout=60)
    assert "already in" in deps_line(cluster, node, a, "prolog")

    (work / "req.txt").write_text("v1\n")
    b = submit(cluster, node, work, "echo b ran\n")
    assert cluster.wait(b) == "COMPLETED", cluster.output(b)
    line = deps_line(cluster, node, b, "prolog")
    assert "outcome=failed" in line and f"job {a} (Slurm: RUNNING)" in line, line
    told = "\n".join(cluster.notices(b))
    assert f"job {a}" in told and str(PREFIX) in told, told
    assert "b ran" in cluster.output(b)
    assert (local / PREFIX.name / "lib" / "installed.txt").read_text() == "v2\n"
    assert not list(local.glob(f"{HOLDER}*"))  # nothing was set aside under A

    # The same key files (v2 shared), another install command: `deps run` would set the
    # restored tree aside for its own install; not while A runs with it.
    (work / "req.txt").write_text("v2\n")
    inode = (local / PREFIX.name).stat().st_ino
    d = submit(cluster, node, work, install(work, more=f" && touch {PREFIX}/lib/d"))
    assert cluster.wait(d) == "COMPLETED", cluster.output(d)
    assert "already in" in deps_line(cluster, node, d, "prolog")
    said = cluster.output(d)
    assert f"job {a} (Slurm: RUNNING) runs with it" in said and "in place" in said, said
    assert (local / PREFIX.name).stat().st_ino == inode  # A's tree, never swapped
    assert not list(local.glob(f"{HOLDER}*"))

    go.touch()
    assert cluster.wait(a) == "COMPLETED", cluster.output(a)
    assert "after: v2" in cluster.output(a), cluster.output(a)
    (work / "req.txt").write_text("v1\n")
    c = submit(cluster, node, work, install(work))
    assert cluster.wait(c) == "COMPLETED", cluster.output(c)
    line = deps_line(cluster, node, c, "prolog")
    assert "outcome=ok" in line and " restored " in line, line
    assert "skipping the install\nv1\n" in cluster.output(c), cluster.output(c)
