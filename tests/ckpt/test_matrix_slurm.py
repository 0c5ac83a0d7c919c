"""The client matrix (issue 23): what frameworks' own checkpointing does, as alice in a
Slurm job on one node, resumed by the next job on another node, byte-equal state.

The rows are :mod:`tests.ckpt.matrix_rows` (one script, run by each job with ``save``
then ``resume``): torch.save into a temporary directory renamed into place with a
``latest`` symlink and appended metrics; torch.distributed.checkpoint; safetensors;
numpy's read-only memmap; Lightning's ``ModelCheckpoint(save_last="link")``; transformers'
``save_pretrained``/``from_pretrained`` and a ``Trainer`` that saves and resumes
(``resume_from_checkpoint``); Orbax's ``CheckpointManager`` with JAX on the CPU (steps
in temporary directories renamed into place, ``max_to_keep``, the latest restored). A
row whose package is not installed is skipped by name.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DevSlurm

pytestmark = pytest.mark.slurm
ROWS = Path(__file__).with_name("matrix_rows.py").read_text()
NEEDS = {
    "torch": ("torch",),
    "dcp": ("torch",),
    "safetensors": ("torch", "safetensors"),
    "numpy_memmap": ("numpy",),
    "lightning": ("torch", "lightning"),
    "transformers": ("torch", "transformers", "accelerate"),
    "orbax": ("jax", "orbax.checkpoint"),
}


def _job(mode: str) -> str:
    # The venv's interpreter, which every user may run; HOME for the frameworks' caches.
    return (
        "#!/bin/sh\nset -e\nexport HOME=$(mktemp -d)\n"
        f"{sys.executable} - {mode} \"$BOOTSEER_CKPT/matrix\" <<'PY'\n{ROWS}\nPY\n"
    )


def _rows(out: str) -> dict[str, str]:
    return {
        line.split()[1]: " ".join(line.split()[2:])
        for line in out.splitlines()
        if line.startswith("row ")
    }


@pytest.fixture
def targets(cluster: DevSlurm) -> Iterator[list[str]]:
    with cluster.ckpt_targets("matrix", count=3, unit_size=1 << 20) as uris:
        yield uris


def test_frameworks_save_on_one_node_and_resume_on_another(
    cluster: DevSlurm, targets: list[str]
) -> None:
    n1, n2 = cluster.nodes[0], cluster.nodes[1]
    save = cluster.sbatch("-N1", f"-w{n1}", "--bootseer-ckpt=demo/matrix", script=_job("save"))
    assert cluster.wait(save, timeout=240) == "COMPLETED", cluster.output(save)
    saved = _rows(cluster.output(save))
    resume = cluster.sbatch("-N1", f"-w{n2}", "--bootseer-ckpt=demo/matrix", script=_job("resume"))
    assert cluster.wait(resume, timeout=240) == "COMPLETED", cluster.output(resume)
    resumed = _rows(cluster.output(resume))
    for job, out in (("save", cluster.output(save)), ("resume", cluster.output(resume))):
        print(job, *(line[5:] for line in out.splitlines() if line.startswith("took ")))
    for row, needs in NEEDS.items():
        if not all(importlib.util.find_spec(m) for m in needs):
            assert resumed[row].startswith("missing"), (row, resumed[row])
            continue
        assert saved[row].startswith("ok "), (row, saved[row], cluster.output(save))
        assert resumed[row] == saved[row], (row, resumed[row], cluster.output(resume))
