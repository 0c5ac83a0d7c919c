"""``bootseer doctor`` on a slurm-dev node: clean as slurm-dev installs it, and naming
what an admin changed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DevSlurm

pytestmark = pytest.mark.slurm


def doctor(cluster: DevSlurm, *args: str) -> subprocess.CompletedProcess[str]:
    bootseer = Path(sys.executable).parent / "bootseer"
    return subprocess.run(
        [str(bootseer), "doctor", "--node", cluster.nodes[0], *args],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def checks(cluster: DevSlurm) -> dict[str, Any]:
    r = doctor(cluster, "--json")
    return {c["name"]: c for c in json.loads(r.stdout)["checks"]}


def test_doctor_is_clean_on_a_slurm_dev_node(cluster: DevSlurm) -> None:
    r = doctor(cluster)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 19
    assert all(ln.startswith(("ok ", "skip ")) and len(ln) <= 80 for ln in lines), r.stdout
    by_name = checks(cluster)
    for name in (
        "plugstack",
        "plugin",
        "prolog",
        "timeout",
        "launch",
        "agent",
        "store",
        "store exposure",
        "phase records",
        "site key",
        "p2p",  # the agent's log: it serves its peers
        "clock",
        "store secrets",
        "stale jobs",
    ):
        assert by_name[name]["status"] == "ok", by_name[name]
    assert "node n1" in by_name["agent"]["detail"]
    assert "wait 160s" in by_name["launch"]["detail"]  # MessageTimeout=30 + BatchStartTimeout=130


def test_doctor_names_a_run_dir_the_plugin_does_not_use(cluster: DevSlurm) -> None:
    cluster.configure("paths", run_dir=f"{cluster.dir}/nodes/%n/elsewhere")
    r = doctor(cluster)
    assert r.returncode == 1
    assert "FAIL plugstack" in r.stdout
    plug = checks(cluster)["plugstack"]
    assert plug["status"] == "problem"
    assert f"rundir={cluster.dir}/nodes/%n/run" in plug["detail"]
    assert f"paths.run_dir {cluster.dir}/nodes/%n/elsewhere" in plug["detail"]
    assert "plugstack.conf:1" in plug["fix"]


def test_doctor_nodeset_in_each_nodes_namespace(cluster: DevSlurm, tmp_path: Path) -> None:
    """``bootseer doctor NODESET``: slurm-dev has no sshd, so the remote shell enters each
    node's network namespace (where its agent and slurmd run) as ssh would reach it."""
    network = cluster.cluster.s.network
    cases = "".join(
        f'  {n}) exec {" ".join(network.enter(n))} sh -c "$2" ;;\n' for n in cluster.nodes
    )
    rsh = tmp_path / "rsh"
    rsh.write_text(
        f'#!/bin/sh\ncase "$1" in\n{cases}  *) echo "no node $1" >&2; exit 255;;\nesac\n'
    )
    rsh.chmod(0o755)
    nodeset = f"{cluster.nodes[0]},{cluster.nodes[1]}"
    r = doctor_nodes(cluster, nodeset, "--rsh", str(rsh))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("ok   n[1-2]: every check passed"), r.stdout

    cluster.configure("paths", run_dir=f"{cluster.dir}/nodes/%n/elsewhere")
    r = doctor_nodes(cluster, nodeset + ",n99", "--rsh", str(rsh))
    assert r.returncode == 1
    assert "FAIL plugstack on n[1-2]\n" in r.stdout, r.stdout
    assert "DOWN n99: no node n99" in r.stdout


def doctor_nodes(cluster: DevSlurm, *args: str) -> subprocess.CompletedProcess[str]:
    bootseer = Path(sys.executable).parent / "bootseer"
    return subprocess.run(
        [str(bootseer), "doctor", *args],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
