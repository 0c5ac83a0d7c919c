"""On the slurm-dev cluster, as an ordinary user: a job whose prolog restores another
snapshot over the node's prefix starts with the old tree still set aside beside it (the
prolog did not wait for its delete), and the job's epilog deletes it, with a holder a
crashed run left there."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import DevSlurm, devcluster
from tests.deps.test_slurm import deps_line

pytestmark = pytest.mark.slurm

PREFIX = devcluster.NODE_LOCAL / "deps-oldtree"
MARK = f".{PREFIX.name}.bootseer-old-"


def on_host(cluster: DevSlurm, node: str) -> Path:
    """The node's local directory (the prefix's parent), as the host sees it."""
    return cluster.dir / "nodes" / node / "local"


def job(cluster: DevSlurm, node: str, work: Path, body: str = "") -> int:
    script = (
        "#!/bin/sh\nset -e\n"
        f"bootseer deps run -- sh -c 'mkdir -p {PREFIX}/lib && "
        f"cp {work}/req.txt {PREFIX}/lib/installed.txt'\n"
        f"cat {PREFIX}/lib/installed.txt\n{body}"
    )
    jid = cluster.sbatch("-w", node, f"--bootseer-deps={PREFIX},key={work}/req.txt", script=script)
    assert cluster.wait(jid) == "COMPLETED", cluster.output(jid)
    return jid


def test_the_old_tree_is_deleted_by_the_epilog_not_the_prolog(cluster: DevSlurm) -> None:
    node = cluster.nodes[0]
    local = on_host(cluster, node)
    work = cluster.dir / "deps-oldtree"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    work.chmod(0o755)
    shutil.rmtree(local / PREFIX.name, ignore_errors=True)
    for left in local.glob(f"{MARK}*"):
        shutil.rmtree(left)

    (work / "req.txt").write_text("v1\n")
    first = job(cluster, node, work)
    assert "captured" in deps_line(cluster, node, first, "epilog")
    shutil.rmtree(local / PREFIX.name)
    (work / "req.txt").write_text("v2\n")
    second = job(cluster, node, work)  # installs v2 into the prefix; the epilog stamps it
    assert "captured" in deps_line(cluster, node, second, "epilog")

    (work / "req.txt").write_text("v1\n")
    crashed = f"{PREFIX.parent}/{MARK}crash001"  # what a run killed mid-sweep left
    third = job(
        cluster,
        node,
        work,
        f"mkdir -p {crashed}/{PREFIX.name} && echo x > {crashed}/{PREFIX.name}/f\n"
        f"ls -a {PREFIX.parent} | grep -F '{MARK}' | sed 's/^/aside: /'\n"
        f"cat {PREFIX.parent}/{MARK}*/{PREFIX.name}/lib/installed.txt | sed 's/^/old: /'\n",
    )
    line = deps_line(cluster, node, third, "prolog")
    assert "outcome=ok" in line and " restored " in line, line
    out = cluster.output(third)
    assert "skipping the install\nv1\n" in out, out  # v1 restored over v2
    assert "old: v2" in out, out  # v2's tree was still there, aside, when the job ran
    assert out.count("aside: ") == 2, out
    line = deps_line(cluster, node, third, "epilog")
    assert "deleted 2 old trees" in line, line
    assert not list(local.glob(f"{MARK}*"))
    assert (local / PREFIX.name / "lib" / "installed.txt").read_text() == "v1\n"
