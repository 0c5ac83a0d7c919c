"""``bootseer doctor`` on a slurm-dev node: clean as slurm-dev installs it, and naming
what an admin changed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import DevSlurm


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
    assert len(lines) == 11
    assert all(ln.startswith(("ok ", "skip ")) and len(ln) <= 80 for ln in lines), r.stdout
    by_name = checks(cluster)
    for name in ("plugstack", "prolog", "timeout", "agent", "store", "site key", "clock"):
        assert by_name[name]["status"] == "ok", by_name[name]
    assert "node n1" in by_name["agent"]["detail"]


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
