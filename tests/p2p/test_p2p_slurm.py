"""Peer-to-peer in real Slurm jobs: a job's nodes share the image's blocks over their links."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import DevSlurm, devcluster, random_image

pytestmark = pytest.mark.slurm

SCRIPT = """#!/bin/sh
srun sh -e -c '
mnt=$(mktemp -d)
squashfuse "$BOOTSEER_IMAGE" "$mnt"
cmp "$mnt/blob" {blob} && echo "blob-same on $(hostname)"
bootseer phase start first_step && bootseer phase end first_step
fusermount3 -u "$mnt"
rmdir "$mnt"
'
"""


@pytest.fixture
def blob_image(cluster: DevSlurm) -> tuple[Path, Path]:
    """A squashfs whose start reads 6 MiB of random bytes."""
    return random_image(cluster, "p2p", 6 << 20)


def _counts(cluster: DevSlurm, node: str, job: int, hook: str) -> dict[str, int]:
    for line in cluster.job_log_lines(node, job):
        if f"{hook} step=image" in line:
            return {k: int(v) for k, v in re.findall(r" (\w+_bytes)=(\d+)", line)}
    raise AssertionError(f"no {hook} image step for job {job} on {node}")


def test_each_hot_block_leaves_the_store_once_for_the_whole_job(
    cluster: DevSlurm, blob_image: tuple[Path, Path]
) -> None:
    image, blob = blob_image
    env_py = f"--export=ALL,BOOTSEER_PYTHON={shutil.which('python3', path=cluster.env['PATH'])}"
    script = SCRIPT.format(blob=blob)
    first = cluster.sbatch("-N1", "-w", "n1", env_py, f"--bootseer-image={image}", script=script)
    assert cluster.wait(first) == "COMPLETED", cluster.output(first)

    second = cluster.sbatch(
        "-N2", "-w", "n3,n4", env_py, f"--bootseer-image={image}", script=script
    )
    assert cluster.wait(second) == "COMPLETED", cluster.output(second)
    assert cluster.output(second).count("blob-same") == 2, cluster.output(second)
    hot = _counts(cluster, "n3", second, "prolog")["hot_bytes"]
    assert hot >= 6 << 20
    # Over the job (the report's image rows: prefetch, the job's reads, the fill): each
    # node fetched its own share from the store and the rest from its peer, so the store
    # gave the job the hot set once, not twice.
    (run,) = cluster.report_json(second)["runs"]
    nodes = {n["node"]: n for n in run["nodes"]}

    def image_counts(node: str) -> dict[str, int]:
        rows = [p for p in nodes[node]["phases"] if p["phase"].startswith("image_")]
        return {k: sum(p[k] for p in rows) for k in ("store_bytes", "peer_bytes")}

    n3, n4 = image_counts("n3"), image_counts("n4")
    store = n3["store_bytes"] + n4["store_bytes"]
    peer = n3["peer_bytes"] + n4["peer_bytes"]
    assert store + peer >= 2 * hot * 0.9, (n3, n4)
    assert store <= hot * 1.1, (n3, n4)
    assert min(n3["peer_bytes"], n4["peer_bytes"]) > 0, (n3, n4)
    # The job's totals: every byte it moved was an image byte here.
    assert (run["store_egress_bytes"], run["peer_bytes"]) == (store, peer), run
    assert run["store_egress_bytes"] == sum(p["store_bytes"] for p in run["phases"])
    assert nodes["n3"]["peer_bytes"] == n3["peer_bytes"] > 0
    prefetch = next(p for p in run["phases"] if p["phase"] == "image_prefetch")
    assert 0 < prefetch["store_bytes"] <= store, prefetch


def test_snapshot_frames_leave_the_store_once_for_the_whole_job(cluster: DevSlurm) -> None:
    """A 2-node restart restores the snapshot on both nodes; each frame is read from the
    store by one of them and handed to the other by its agent."""
    cluster.configure("deps", frame_bytes=256 << 10)  # 3 MiB of random bytes: 12 frames
    work = cluster.dir / "p2p-deps"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(mode=0o755)
    (work / "req.txt").write_text(f"blob {os.urandom(8).hex()}\n")
    (work / "req.txt").chmod(0o644)
    prefix = devcluster.NODE_LOCAL / f"p2p-deps-{os.urandom(4).hex()}"
    opt = f"--bootseer-deps={prefix},key={work}/req.txt"
    install = (
        "#!/bin/sh\nset -e\n"
        f"bootseer deps run -- sh -c 'mkdir -p {prefix}/lib && "
        f"head -c 3145728 /dev/urandom > {prefix}/lib/blob'\n"
    )
    first = cluster.sbatch("-N1", "-w", "n1", opt, script=install)
    assert cluster.wait(first) == "COMPLETED", cluster.output(first)

    check = f"#!/bin/sh\nsrun sh -c 'test -s {prefix}/lib/blob && echo restored-on-$(hostname)'\n"
    second = cluster.sbatch("-N2", "-w", "n3,n4", opt, script=check)
    assert cluster.wait(second) == "COMPLETED", cluster.output(second)
    assert cluster.output(second).count("restored-on-") == 2, cluster.output(second)
    counts = []
    for node in ("n3", "n4"):
        (line,) = [ln for ln in cluster.job_log_lines(node, second) if "prolog step=deps" in ln]
        assert " restored " in line, line
        counts.append({k: int(v) for k, v in re.findall(r" (\w+_bytes)=(\d+)", line)})
    store = sum(c["store_bytes"] for c in counts)
    peer = sum(c["peer_bytes"] for c in counts)
    archive = 3 << 20  # random bytes: zstd stores them about as they are
    assert archive * 0.9 <= store <= archive * 1.15, counts
    assert peer >= archive * 0.3 and all(c["peer_bytes"] > 0 for c in counts), counts
    # The deps_restore rows say the same, and count toward the job's store egress.
    (run,) = cluster.report_json(second)["runs"]
    restore = next(p for p in run["phases"] if p["phase"] == "deps_restore")
    assert (restore["store_bytes"], restore["peer_bytes"]) == (store, peer), restore
    assert run["store_egress_bytes"] >= store and run["peer_bytes"] >= peer, run


CKPT_SAVE = """#!/bin/sh
set -e
head -c 4194304 /dev/urandom > "$BOOTSEER_CKPT/model.bin"
"""
CKPT_LOAD = """#!/bin/sh
srun sh -e -c 'sha256sum < "$BOOTSEER_CKPT/model.bin" | sed "s/^/loaded $(hostname) /"'
"""


def test_checkpoint_units_leave_the_targets_once_for_the_whole_job(cluster: DevSlurm) -> None:
    """A data-parallel restart reads the same checkpoint on every node: each unit is read
    from its target by one node and handed to the other by its agent."""
    roots = [cluster.dir / f"p2p-ckpt-t{i}" for i in range(2)]
    for r in roots:
        shutil.rmtree(r, ignore_errors=True)
        r.mkdir()  # the site makes a store's root, never bootseer
    cluster.configure("ckpt", targets=[f"file://{r}" for r in roots], unit_size=256 << 10)
    name = f"p2p-{os.urandom(4).hex()}"
    first = cluster.sbatch("-N1", "-w", "n1", f"--bootseer-ckpt={name}", script=CKPT_SAVE)
    assert cluster.wait(first) == "COMPLETED", cluster.output(first)

    second = cluster.sbatch("-N2", "-w", "n3,n4", f"--bootseer-ckpt={name}", script=CKPT_LOAD)
    assert cluster.wait(second) == "COMPLETED", cluster.output(second)
    sums = {ln.split()[2] for ln in cluster.output(second).splitlines() if ln.startswith("loaded")}
    assert len(sums) == 1, cluster.output(second)  # both nodes read the same bytes
    counts = []
    for node in ("n3", "n4"):
        (line,) = [ln for ln in cluster.job_log_lines(node, second) if "epilog step=ckpt" in ln]
        counts.append({k: int(v) for k, v in re.findall(r" (\w+_bytes)=(\d+)", line)})
    size = 4 << 20
    store = sum(c["store_bytes"] for c in counts)
    assert size * 0.9 <= store <= size * 1.15, counts
    assert all(c["peer_bytes"] > 0 for c in counts), counts
    # The ckpt_unmount rows say the same, and count toward the job's store egress.
    (run,) = cluster.report_json(second)["runs"]
    unmount = next(p for p in run["phases"] if p["phase"] == "ckpt_unmount")
    assert unmount["store_bytes"] == store and unmount["peer_bytes"] > 0, unmount
    assert run["store_egress_bytes"] >= store, run
