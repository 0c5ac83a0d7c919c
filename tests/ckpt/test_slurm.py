"""Striped checkpoints on a real Slurm cluster: one job saves through the mount, the next
loads it back on another node."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer import mounts
from bootseer.ckpt import Namespace
from bootseer.store import open_store
from tests.conftest import DevSlurm

pytestmark = pytest.mark.slurm
UNIT = 1 << 20

SAVE = """#!/bin/sh
set -e
echo "ckpt=$BOOTSEER_CKPT"
mkdir -p "$BOOTSEER_CKPT/run1"
/usr/bin/python3 - <<'PY'
import hashlib, os
data = bytes(range(256)) * (5 * 4096 + 17)  # a little over 5 units
with open(os.environ["BOOTSEER_CKPT"] + "/run1/model.bin", "wb") as f:
    f.write(data)
print("saved", len(data), hashlib.sha256(data).hexdigest())
PY
"""

LOAD = """#!/bin/sh
set -e
/usr/bin/python3 - <<'PY'
import hashlib, os
with open(os.environ["BOOTSEER_CKPT"] + "/run1/model.bin", "rb") as f:
    data = f.read()
print("loaded", len(data), hashlib.sha256(data).hexdigest())
PY
ls -l "$BOOTSEER_CKPT/run1"
"""


@pytest.fixture
def targets(cluster: DevSlurm) -> Iterator[list[str]]:
    with cluster.ckpt_targets("ckpt", count=3, unit_size=UNIT) as uris:
        yield uris


def _mounts(cluster: DevSlurm) -> list[str]:
    return [
        line.split()[1]
        for line in Path("/proc/mounts").read_text().splitlines()
        if line.startswith("bootseer-ckpt:") and str(cluster.dir) in line
    ]


def test_a_job_saves_through_the_mount_and_the_next_job_loads_it(
    cluster: DevSlurm, targets: list[str]
) -> None:
    n1, n2 = cluster.nodes[0], cluster.nodes[1]
    save = cluster.sbatch("-N1", f"-w{n1}", "--bootseer-ckpt=demo/llama", script=SAVE)
    assert cluster.wait(save) == "COMPLETED", cluster.output(save)
    out = cluster.output(save)
    mp = cluster.dir / "nodes" / n1 / "run" / "ckpt" / str(save)
    assert f"ckpt={mp}" in out
    saved = next(line for line in out.splitlines() if line.startswith("saved"))
    log = "\n".join(cluster.job_log_lines(n1, save))
    assert "prolog step=ckpt outcome=ok" in log and "epilog step=ckpt outcome=ok" in log, log

    # The file is striped over the targets: its units are spread over all three.
    ns = Namespace([open_store(u) for u in targets], "alice/demo/llama", unit_size=UNIT)
    m = ns.manifest("run1/model.bin")
    assert m is not None and m.unit_count == 6 and len(set(m.targets)) == 3

    load = cluster.sbatch("-N1", f"-w{n2}", "--bootseer-ckpt=demo/llama", script=LOAD)
    assert cluster.wait(load) == "COMPLETED", cluster.output(load)
    loaded = next(line for line in cluster.output(load).splitlines() if line.startswith("loaded"))
    assert loaded.split()[1:] == saved.split()[1:]
    expected = hashlib.sha256(bytes(range(256)) * (5 * 4096 + 17)).hexdigest()
    assert loaded.split()[2] == expected
    # The epilogs unmounted both jobs' mounts and left no daemon behind.
    assert _mounts(cluster) == []
    assert not mp.exists()


def test_bob_cannot_read_alices_checkpoint_from_the_targets(
    cluster: DevSlurm, targets: list[str]
) -> None:
    """alice's checkpoint units and manifests sit on the file:// targets as root's 0600
    objects in 0700 directories: bob cannot read them from the backing storage."""
    n1 = cluster.nodes[0]
    save = cluster.sbatch("-N1", f"-w{n1}", "--bootseer-ckpt=demo/private", script=SAVE)
    assert cluster.wait(save) == "COMPLETED", cluster.output(save)
    files = [p for t in targets for p in Path(t.removeprefix("file://")).rglob("*") if p.is_file()]
    # six units over three targets, and the manifest
    assert len([p for p in files if "alice" in str(p)]) >= 7, files
    assert cluster.readable_by("bob", files) == []
    # alice herself reads her checkpoint through the mount of her job, not from the targets
    assert cluster.readable_by("alice", files) == []


def test_a_killed_job_is_unmounted_and_its_partial_save_dropped(
    cluster: DevSlurm, targets: list[str]
) -> None:
    n1 = cluster.nodes[0]
    first = cluster.sbatch("-N1", f"-w{n1}", "--bootseer-ckpt=demo/kill", script=SAVE)
    assert cluster.wait(first) == "COMPLETED", cluster.output(first)
    ns = Namespace([open_store(u) for u in targets], "alice/demo/kill", unit_size=UNIT)
    before = ns.manifest("run1/model.bin")
    assert before is not None
    # A job that keeps writing until it is cancelled.
    endless = """#!/bin/sh
/usr/bin/python3 - <<'PY'
import os, time
with open(os.environ["BOOTSEER_CKPT"] + "/run1/model.bin", "wb") as f:
    print("writing", flush=True)
    while True:
        f.write(b"x" * 65536)
        time.sleep(0.001)
PY
"""
    job = cluster.sbatch("-N1", f"-w{n1}", "--bootseer-ckpt=demo/kill", script=endless)
    t_end = time.monotonic() + 60
    while time.monotonic() < t_end and "writing" not in _output(cluster, job):
        time.sleep(0.2)
    assert "writing" in _output(cluster, job)
    subprocess.run(["scancel", str(job)], env=cluster.env, check=True)
    cluster.wait(job)
    after = ns.manifest("run1/model.bin")
    assert after is not None and after.version == before.version
    log = "\n".join(cluster.job_log_lines(n1, job))
    assert "epilog step=ckpt outcome=ok" in log and "1 writes dropped" in log, log
    assert _mounts(cluster) == []
    assert not mounts.is_mounted(cluster.dir / "nodes" / n1 / "run" / "ckpt" / str(job))


def _output(cluster: DevSlurm, job: int) -> str:
    try:
        return cluster.output(job)
    except FileNotFoundError:
        return ""


SAVE_REAL = """#!/bin/sh
set -e
{py} - <<'PY'
import hashlib, os, numpy as np
from safetensors.numpy import save_file
d = os.environ["BOOTSEER_CKPT"] + "/st"
os.makedirs(d, exist_ok=True)
rng = np.random.default_rng(5)
save_file({{"w": rng.random((700, 1000), dtype=np.float32), "b": np.arange(10)}},
          d + "/model.safetensors")
np.savez(d + "/opt.npz", m=rng.random(400000), v=np.arange(300000))
for name in ("model.safetensors", "opt.npz"):
    print("saved", name, hashlib.sha256(open(f"{{d}}/{{name}}", "rb").read()).hexdigest())
print("files", sorted(os.listdir(d)))
log = open(os.environ["BOOTSEER_CKPT"] + "/.bootseer.log").read()
print("log", "committed version" in log)
PY
"""

LOAD_REAL = """#!/bin/sh
set -e
{py} - <<'PY'
import hashlib, os, numpy as np
from safetensors.numpy import load_file
d = os.environ["BOOTSEER_CKPT"] + "/st"
rng = np.random.default_rng(5)
t = load_file(d + "/model.safetensors")
assert (t["w"] == rng.random((700, 1000), dtype=np.float32)).all()
assert (t["b"] == np.arange(10)).all()
with np.load(d + "/opt.npz") as z:
    assert (z["m"] == rng.random(400000)).all() and (z["v"] == np.arange(300000)).all()
for name in ("model.safetensors", "opt.npz"):
    print("loaded", name, hashlib.sha256(open(f"{{d}}/{{name}}", "rb").read()).hexdigest())
PY
"""


def test_safetensors_and_numpy_save_in_one_job_and_load_in_the_next(
    cluster: DevSlurm, targets: list[str]
) -> None:
    """Issue 12: safetensors' save_file (ftruncate, write from 0, rename while open) and
    np.savez (headers patched behind the stream) through a job's mount as alice, the
    daemon's log readable by her; the next job loads both on another node."""
    pytest.importorskip("safetensors")
    n1, n2 = cluster.nodes[0], cluster.nodes[1]
    py = sys.executable  # the venv's, which every user may run
    save = cluster.sbatch(
        "-N1", f"-w{n1}", "--bootseer-ckpt=demo/st", script=SAVE_REAL.format(py=py)
    )
    assert cluster.wait(save) == "COMPLETED", cluster.output(save)
    out = cluster.output(save)
    assert "files ['model.safetensors', 'opt.npz']" in out and "log True" in out, out
    load = cluster.sbatch(
        "-N1", f"-w{n2}", "--bootseer-ckpt=demo/st", script=LOAD_REAL.format(py=py)
    )
    assert cluster.wait(load) == "COMPLETED", cluster.output(load)
    saved = sorted(line.split()[1:] for line in out.splitlines() if line.startswith("saved"))
    loaded = sorted(
        line.split()[1:] for line in cluster.output(load).splitlines() if line.startswith("loaded")
    )
    assert saved == loaded and len(saved) == 2
