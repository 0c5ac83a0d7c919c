"""Dependency snapshots on the slurm-dev cluster: the second run restores instead of
installing, on every node, and the node logs (and so the phase records) say so.

One job per node, all at once, each as an ordinary user with a prefix in the node's own
local directory (slurm-dev's NODE_LOCAL), named for the node so that each job makes a
snapshot of its own.
"""

from __future__ import annotations

import json
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from bootseer.sitekey import DEPS_MANIFEST, load_keys, strip
from tests.conftest import DevSlurm, devcluster
from tests.deps.conftest import entries_of, member, publish, tar_bytes

pytestmark = pytest.mark.slurm


def prefix_of(node: str) -> Path:
    """The prefix of the job on ``node``, as the job sees it."""
    return devcluster.NODE_LOCAL / f"deps-it-{node}"


def node_prefix(cluster: DevSlurm, node: str) -> Path:
    """Where that prefix lies on the host."""
    return cluster.dir / "nodes" / node / "local" / prefix_of(node).name


def submit_all(cluster: DevSlurm, work: Path) -> dict[str, int]:
    jobs = {}
    for node in cluster.nodes:
        prefix = prefix_of(node)
        script = (
            "#!/bin/sh\nset -e\n"
            f"bootseer deps run -- sh -c 'mkdir -p {prefix}/lib && "
            f"cp {work}/req.txt {prefix}/lib/installed.txt && "
            f"ln -sf {sys.executable} {prefix}/python'\n"
            f"cat {prefix}/lib/installed.txt\n"
        )
        jobs[node] = cluster.sbatch(
            "-w", node, f"--bootseer-deps={prefix},key={work}/req.txt", script=script
        )
    for job in jobs.values():
        assert cluster.wait(job) == "COMPLETED", cluster.output(job)
    return jobs


def deps_line(cluster: DevSlurm, node: str, job: int, hook: str) -> str:
    lines = [ln for ln in cluster.job_log_lines(node, job) if f"{hook} step=deps" in ln]
    assert lines, cluster.node_log(node)[-2000:]
    return lines[0]


def node_phases(cluster: DevSlurm, job: int) -> dict[str, dict[str, Any]]:
    (run,) = cluster.report_json(job)["runs"]
    (node,) = run["nodes"]
    return {p["phase"]: p for p in node["phases"]}


def test_second_run_restores_on_every_node(cluster: DevSlurm) -> None:
    work = cluster.dir / "deps-it"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    for node in cluster.nodes:
        shutil.rmtree(node_prefix(cluster, node), ignore_errors=True)
    (work / "req.txt").write_text("demo==1\n")
    cluster.configure(
        "deps",
        link_roots=[
            "/usr",
            "/opt",
            str(Path(sys.executable).parents[1]),
            str(Path(sys.executable).resolve().parents[1]),
        ],
    )
    first = submit_all(cluster, work)
    for node, job in first.items():
        assert "no snapshot" in deps_line(cluster, node, job, "prolog")
        assert "captured" in deps_line(cluster, node, job, "epilog")
        assert "the epilog captures" in cluster.output(job)
        phases = node_phases(cluster, job)
        assert phases["deps_install"]["outcome"] == "ok", phases
        assert phases["deps_install"]["bytes"] == len("demo==1\n")
        assert phases["deps_capture"]["outcome"] == "ok" and phases["deps_capture"]["bytes"] > 0
    # A restart lands on a fresh node (prefix gone) or back on the same one (prefix kept).
    same = cluster.nodes[0]
    for node in cluster.nodes[1:]:
        shutil.rmtree(node_prefix(cluster, node))
    second = submit_all(cluster, work)
    for node, job in second.items():
        line = deps_line(cluster, node, job, "prolog")
        if node == same:  # the epilog stamped the installed prefix: nothing to restore
            assert "outcome=ok" in line and "already in" in line, line
        else:
            assert "outcome=ok" in line and " restored " in line, line
            assert node_phases(cluster, job)["deps_restore"]["bytes"] > 0
        assert node_phases(cluster, job)["deps_install"]["outcome"] == "skipped"
        assert "skipping the install" in cluster.output(job)
        assert "demo==1" in cluster.output(job)
        assert "nothing installed" in deps_line(cluster, node, job, "epilog")


def test_a_prefix_another_user_made_first_is_refused_and_the_job_still_runs(
    cluster: DevSlurm,
) -> None:
    """mallory's job makes alice's predictable node-local prefix first, empty and
    world-writable; alice's job then gets a clear refusal from the prolog and from
    `bootseer deps run`, its install never lands in mallory's directory, and the node
    stays in service."""
    node = cluster.nodes[1]
    prefix = devcluster.NODE_LOCAL / "deps-it-taken"
    shutil.rmtree(node_prefix(cluster, node).with_name(prefix.name), ignore_errors=True)
    trap = cluster.sbatch("-w", node, script=f"#!/bin/sh\nmkdir -m 777 {prefix}\n", user="mallory")
    assert cluster.wait(trap) == "COMPLETED", cluster.output(trap)
    job = cluster.sbatch(
        "-w",
        node,
        f"--bootseer-deps={prefix}",
        script=(
            "#!/bin/sh\n"
            f"bootseer deps run -- sh -c 'touch {prefix}/installed' || echo install-refused\n"
            "echo ran\n"
        ),
    )
    assert cluster.wait(job) == "COMPLETED", cluster.output(job)
    out = cluster.output(job)
    assert "refusing to install into" in out and "install-refused" in out and "ran" in out, out
    line = deps_line(cluster, node, job, "prolog")
    assert "outcome=failed" in line and "belongs to uid" in line, line
    assert "outcome=ok" not in deps_line(cluster, node, job, "epilog")
    assert not (node_prefix(cluster, node).with_name(prefix.name) / "installed").exists()
    assert cluster.node_states()[node].startswith("idle")


def test_a_planted_snapshot_manifest_is_refused_and_the_job_reinstalls(
    cluster: DevSlurm,
) -> None:
    """Someone who can write the store (not the site key) replaces alice's snapshot with
    one of her own: its manifest and ref, written with the store API. alice's next job,
    on a fresh node, refuses it (the prolog logs why), installs the ordinary way, and its
    epilog captures a sealed snapshot again, which the job after that restores."""
    work = cluster.dir / "deps-sealed"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    (work / "req.txt").write_text("sealed==1\n")
    prefix = devcluster.NODE_LOCAL / "deps-it-sealed"
    for node in cluster.nodes:
        shutil.rmtree(node_prefix(cluster, node).with_name(prefix.name), ignore_errors=True)
    script = (
        "#!/bin/sh\nset -e\n"
        f"bootseer deps run -- sh -c 'mkdir -p {prefix}/bin && "
        f"cp {work}/req.txt {prefix}/bin/tool'\n"
        f"cat {prefix}/bin/tool\n"
    )
    spec = f"--bootseer-deps={prefix},key={work}/req.txt"
    n0, n1, n2 = cluster.nodes[:3]
    first = cluster.sbatch("-w", n0, spec, script=script)
    assert cluster.wait(first) == "COMPLETED", cluster.output(first)
    assert "captured" in deps_line(cluster, n0, first, "epilog")

    store = cluster.cluster.open_store()
    keys = load_keys(cluster.dir / "etc" / "site.key")
    (path,) = [
        o.key
        for o in store.list("deps/user/alice", recursive=True)
        if o.key.endswith("/manifest.json")
        and json.loads(strip(store.read_bytes(o.key)))["prefix"] == str(prefix)
    ]
    genuine = json.loads(keys.open(DEPS_MANIFEST, path, store.read_bytes(path)))
    evil = [
        member("bin", tarfile.DIRTYPE, mode=0o755),
        member("bin/tool", data=b"pwned==6\n", mode=0o755),
    ]
    publish(
        store,
        tar_bytes(evil),
        entries_of(evil),
        prefix=str(prefix),
        scope="user/alice",
        base=genuine["base"],
        key=genuine["key"],
        keys=None,  # no site key: what anyone but a root-run part writes
    )

    second = cluster.sbatch("-w", n1, spec, script=script)
    assert cluster.wait(second) == "COMPLETED", cluster.output(second)
    out = cluster.output(second)
    assert "pwned" not in out and "sealed==1" in out, out
    assert "the epilog captures" in out, out
    line = deps_line(cluster, n1, second, "prolog")
    assert "outcome=failed" in line and "not sealed with the site key" in line, line
    assert "captured" in deps_line(cluster, n1, second, "epilog")
    assert cluster.node_states()[n1].startswith("idle")

    third = cluster.sbatch("-w", n2, spec, script=script)
    assert cluster.wait(third) == "COMPLETED", cluster.output(third)
    assert "sealed==1" in cluster.output(third) and "skipping the install" in cluster.output(third)
    assert " restored " in deps_line(cluster, n2, third, "prolog")


def test_bob_cannot_read_alices_snapshot_from_the_store(cluster: DevSlurm) -> None:
    """alice's snapshot (its archive frames hold her config files) sits in the file://
    store as root's 0600 objects in 0700 directories: bob cannot read it from the backing
    storage, while her job's phase records stay readable for `bootseer report`."""
    work = cluster.dir / "deps-private"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    (work / "req.txt").write_text("private==1\n")
    prefix = devcluster.NODE_LOCAL / "deps-it-private"
    node = cluster.nodes[0]
    shutil.rmtree(node_prefix(cluster, node).with_name(prefix.name), ignore_errors=True)
    script = (
        "#!/bin/sh\nset -e\n"
        f"bootseer deps run -- sh -c 'mkdir -p {prefix}/etc && "
        f"echo token=alices-secret > {prefix}/etc/app.conf'\n"
    )
    job = cluster.sbatch("-w", node, f"--bootseer-deps={prefix},key={work}/req.txt", script=script)
    assert cluster.wait(job) == "COMPLETED", cluster.output(job)
    assert "captured" in deps_line(cluster, node, job, "epilog")

    store_dir = cluster.dir / "store"
    mine = [
        p
        for p in (store_dir / "deps" / "user" / "alice").rglob("*")
        if p.is_file() and str(prefix) in _manifest_prefix(p)
    ]
    snapshot = [p for p in (store_dir / "deps" / "user" / "alice").rglob("*") if p.is_file()]
    assert mine and snapshot, sorted(store_dir.rglob("*"))
    assert cluster.readable_by("bob", snapshot) == []
    assert cluster.readable_by("mallory", snapshot) == []
    # The report reads the job's phase records as the user who runs it.
    runs = cluster.report_json(job, user="bob")["runs"]
    assert runs and runs[0]["nodes"], runs


def _manifest_prefix(path: Path) -> str:
    """The prefix a snapshot's manifest names (root reads it), or "" for other files."""
    if path.name != "manifest.json":
        return ""
    return str(json.loads(strip(path.read_bytes())).get("prefix", ""))
