"""Who shares a snapshot scope, in real Slurm jobs of different users (issue 11).

``scope=account`` shares snapshots among the jobs of one Slurm account: whatever one
member's install leaves is restored into another member's job and runs as him. That is
the site's choice, but only among the account's members: the account must be one Slurm
checked the user may charge, not any name a user writes after ``--account``.
"""

from __future__ import annotations

import shutil

import devcluster
import pytest

from tests.conftest import DevSlurm

pytestmark = pytest.mark.slurm


def _deps_line(cluster: DevSlurm, node: str, job: int, hook: str) -> str:
    lines = [ln for ln in cluster.job_log_lines(node, job) if f"{hook} step=deps" in ln]
    assert lines, cluster.node_log(node)[-2000:]
    return lines[0]


def test_an_account_slurm_does_not_check_shares_no_snapshot(cluster: DevSlurm) -> None:
    """The site allows scope=account; Slurm keeps no accounting (slurm-dev, like many
    clusters), so `--account` is whatever the user writes. mallory submits as bob's
    account, installs with bob's very command, alters the installed tool before her
    epilog captures it, and bob's next job must not run her tool. Before, her snapshot
    went to account/physics under bob's key, and his job restored and ran it."""
    cluster.configure("deps", scopes=["user", "account"])
    work = cluster.dir / "deps-account"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    (work / "req.txt").write_text("shared==1\n")
    work.chmod(0o755)
    (work / "req.txt").chmod(0o644)
    prefix = devcluster.NODE_LOCAL / "deps-it-account"
    for node in cluster.nodes:
        shutil.rmtree(cluster.dir / "nodes" / node / "local" / prefix.name, ignore_errors=True)
    install = (
        f"bootseer deps run -- sh -c 'mkdir -p {prefix}/bin && cp {work}/req.txt {prefix}/bin/tool'"
    )
    honest = f"#!/bin/sh\nset -e\n{install}\ncat {prefix}/bin/tool\n"
    evil = f"#!/bin/sh\nset -e\n{install}\necho pwned-by-mallory > {prefix}/bin/tool\n"
    spec = f"--bootseer-deps={prefix},key={work}/req.txt,scope=account"
    n0, n1 = cluster.nodes[:2]

    m = cluster.sbatch("-w", n0, "--account=physics", spec, script=evil, user="mallory")
    assert cluster.wait(m) == "COMPLETED", cluster.output(m)
    b = cluster.sbatch("-w", n1, "--account=physics", spec, script=honest, user="bob")
    assert cluster.wait(b) == "COMPLETED", cluster.output(b)
    out = cluster.output(b)
    assert "pwned" not in out, f"bob's job ran mallory's install: {out}"
    assert "shared==1" in out, out
    line = _deps_line(cluster, n1, b, "prolog")
    assert "scope=account refused: Slurm keeps no accounting" in line, line  # it asked Slurm
    assert "using scope=user" in line, line


def test_a_restored_prefix_keeps_its_owners_mode(cluster: DevSlurm) -> None:
    """alice keeps her installed prefix to herself (mode 0700: its files are 0644, as
    installers leave them, and the directory keeps them private). Her next job, on
    another node, gets it restored: bob must not read her token there either. Before,
    every restored prefix was made 0755."""
    work = cluster.dir / "deps-private-mode"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    (work / "req.txt").write_text("mode==1\n")
    work.chmod(0o755)
    (work / "req.txt").chmod(0o644)
    prefix = devcluster.NODE_LOCAL / "deps-it-mode"
    for node in cluster.nodes:
        shutil.rmtree(cluster.dir / "nodes" / node / "local" / prefix.name, ignore_errors=True)
    script = (
        "#!/bin/sh\nset -e\n"
        f"bootseer deps run -- sh -c 'mkdir -p {prefix}/etc && chmod 700 {prefix} && "
        f"echo token=alices-secret > {prefix}/etc/app.conf'\n"
        f"stat -c 'mode=%a' {prefix}\n"
    )
    spec = f"--bootseer-deps={prefix},key={work}/req.txt"
    n0, n1 = cluster.nodes[:2]
    first = cluster.sbatch("-w", n0, spec, script=script)
    assert cluster.wait(first) == "COMPLETED", cluster.output(first)
    assert "mode=700" in cluster.output(first)
    assert "captured" in _deps_line(cluster, n0, first, "epilog")
    second = cluster.sbatch("-w", n1, spec, script=script)
    assert cluster.wait(second) == "COMPLETED", cluster.output(second)
    assert " restored " in _deps_line(cluster, n1, second, "prolog")
    assert "mode=700" in cluster.output(second), cluster.output(second)
    restored = cluster.dir / "nodes" / n1 / "local" / prefix.name
    assert cluster.readable_by("bob", [restored / "etc" / "app.conf"]) == []


def test_a_file_others_could_change_is_not_captured(cluster: DevSlurm) -> None:
    """bob's install leaves a file every user may write (0666: a careless umask in one
    step). While his job runs, mallory, on the same node, writes her code into it; his
    epilog must not seal that into his snapshot, which his later jobs on every node
    would restore and run. Before, it did: his next job, elsewhere, ran hers."""
    work = cluster.dir / "deps-writable"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    work.chmod(0o1777)
    (work / "req.txt").write_text("writable==1\n")
    (work / "req.txt").chmod(0o644)
    prefix = devcluster.NODE_LOCAL / "deps-it-writable"
    for node in cluster.nodes:
        shutil.rmtree(cluster.dir / "nodes" / node / "local" / prefix.name, ignore_errors=True)
    install = (
        f"bootseer deps run -- sh -c 'mkdir -p {prefix}/bin && "
        f"(umask 0; echo honest-tool > {prefix}/bin/tool)'"
    )
    wait_for = (
        "i=0; while [ ! -e {marker} ]; do i=$((i+1)); "
        '[ $i -gt 600 ] && echo "no {marker}" && exit 1; sleep 0.1; done'
    )
    bobs = (
        f"#!/bin/sh\nset -e\n{install}\ntouch {work}/installed\n"
        + wait_for.format(marker=f"{work}/tampered")
        + f"\ncat {prefix}/bin/tool\n"
    )
    mallorys = (
        "#!/bin/sh\nset -e\n"
        + wait_for.format(marker=f"{work}/installed")
        + f"\necho pwned-by-mallory > {prefix}/bin/tool\ntouch {work}/tampered\n"
    )
    spec = f"--bootseer-deps={prefix},key={work}/req.txt"
    n0, n1 = cluster.nodes[:2]
    b = cluster.sbatch("-w", n0, spec, script=bobs, user="bob")
    m = cluster.sbatch("-w", n0, script=mallorys, user="mallory")
    assert cluster.wait(m) == "COMPLETED", cluster.output(m)
    assert cluster.wait(b) == "COMPLETED", cluster.output(b)
    assert "pwned-by-mallory" in cluster.output(b)  # she did change his running install
    line = _deps_line(cluster, n0, b, "epilog")
    assert "outcome=ok" not in line and "writable by every user" in line, line
    honest = f"#!/bin/sh\nset -e\n{install}\ncat {prefix}/bin/tool\n"
    again = cluster.sbatch("-w", n1, spec, script=honest, user="bob")
    assert cluster.wait(again) == "COMPLETED", cluster.output(again)
    out = cluster.output(again)
    assert "pwned" not in out and "honest-tool" in out, out
