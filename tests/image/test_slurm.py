"""Lazy images in real Slurm jobs: squashfuse mounts the agent's file, a program runs from it."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import TOP, DevSlurm, squash

pytestmark = pytest.mark.slurm


@pytest.fixture
def app_image(cluster: DevSlurm) -> Path:
    """A squashfs with a real program (cat) and data, where every job user can read it."""
    src = cluster.dir / "image-src"
    shutil.rmtree(src, ignore_errors=True)
    (src / "bin").mkdir(parents=True)
    shutil.copy2("/bin/cat", src / "bin" / "cat")
    (src / "message").write_text("hello from the lazy image\n")
    (src / "blob").write_bytes(bytes(range(256)) * 8000)
    out = cluster.dir / "images" / "app.sqsh"
    out.parent.mkdir(exist_ok=True)
    out.unlink(missing_ok=True)
    return squash(src, out)


# The importer is called as pyxis calls it for --container-image=bootseer (``get
# docker://bootseer`` with pyxis' environment, tests/pyxiskit.py), then released twice.
# The batch step itself does not get BOOTSEER_* (the SPANK plugin sets them for srun
# steps), so the work runs in one srun step, as a container launcher would.
SCRIPT = """#!/bin/sh
srun sh -e -c '
mnt=$(mktemp -d)
squashfuse "$BOOTSEER_IMAGE" "$mnt"
"$mnt/bin/cat" "$mnt/message"
bootseer phase start first_step && bootseer phase end first_step
cmp "$mnt/blob" {blob} && echo blob-same
fusermount3 -u "$mnt"
rmdir "$mnt"
pyxis=$("$BOOTSEER_PYTHON" {pyxiskit} {importer} bootseer)
test "$(echo "$pyxis" | head -n 1)" = "get rc=0 path=$BOOTSEER_IMAGE" && echo importer-ok
test "$(echo "$pyxis" | tail -n +2)" = "$(printf "release rc=0\nrelease rc=0")" && echo released
echo "ref=$BOOTSEER_IMAGE_REF"
'
"""


def _detail(cluster: DevSlurm, node: str, job: int, hook: str) -> str:
    for line in cluster.job_log_lines(node, job):
        if f"{hook} step=image" in line:
            return line
    raise AssertionError(f"no {hook} image step for job {job} on {node}")


def test_job_runs_a_program_from_the_lazy_image_and_the_second_run_prefetches(
    cluster: DevSlurm, app_image: Path
) -> None:
    blob = cluster.dir / "image-src" / "blob"
    importer = TOP / "contrib" / "pyxis" / "bootseer-importer"
    script = SCRIPT.format(blob=blob, importer=importer, pyxiskit=TOP / "tests" / "pyxiskit.py")
    env_py = f"--export=ALL,BOOTSEER_PYTHON={shutil.which('python3', path=cluster.env['PATH'])}"
    first = cluster.sbatch(
        "-N1", "-w", "n2", env_py, f"--bootseer-image={app_image}", script=script
    )
    assert cluster.wait(first) == "COMPLETED", cluster.output(first)
    assert cluster.output(first).split("\n")[:4] == [
        "hello from the lazy image",
        "blob-same",
        "importer-ok",
        "released",
    ]
    # What the job asked for, the same every run (a dependency snapshot keys on it).
    assert f"ref={app_image}" in cluster.output(first)
    line = _detail(cluster, "n2", first, "prolog")
    assert "outcome=ok" in line and "hot_blocks=0" in line, line
    epilog = _detail(cluster, "n2", first, "epilog")
    # The job's first_step mark told the agent, which ended the trace there.
    assert "trace=saved" in epilog and re.search(r"fetched_before_first_step=\d+ ", epilog), epilog

    # The second run, on another node with a cold cache, prefetches what the first read.
    second = cluster.sbatch(
        "-N1", "-w", "n3", env_py, f"--bootseer-image={app_image}", script=script
    )
    assert cluster.wait(second) == "COMPLETED", cluster.output(second)
    assert cluster.output(second).startswith("hello from the lazy image\nblob-same\n")
    line = _detail(cluster, "n3", second, "prolog")
    hot = int(re.search(r"hot_blocks=(\d+)", line).group(1))  # type: ignore[union-attr]
    fetched = int(re.search(r"fetched_blocks=(\d+)", line).group(1))  # type: ignore[union-attr]
    # The prolog waited for the leading quarter of the hot set (hot_start_fraction).
    assert hot > 0 and fetched >= hot / 4 and "trace_runs=1" in line, line
