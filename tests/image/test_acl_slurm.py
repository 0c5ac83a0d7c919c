"""Who gets which image bytes, in real Slurm jobs of different users (issue 11).

The node's block cache is shared by digest: a block is served to any job whose image's
manifest names its digest. That is safe only if a job's manifest can name no block its
user could not read, so a path image's manifest must come from the very file the job's
user opened, never from another file that once had the same path, size and mtime.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import DevSlurm

pytestmark = pytest.mark.slurm

READ = """#!/bin/sh
srun sh -c 'sha256sum < "$BOOTSEER_IMAGE"'
"""


def _squashfs(src: Path, dest: Path, seed: int) -> Path:
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    (src / "secret").write_bytes(random.Random(seed).randbytes(600_000))
    subprocess.run(
        ["mksquashfs", str(src), str(dest), "-noappend", "-quiet", "-no-progress"],
        check=True,
        capture_output=True,
    )
    shutil.rmtree(src)
    return dest


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_file_at_another_users_old_path_gets_its_own_bytes_not_his(cluster: DevSlurm) -> None:
    """bob runs a job from his private image in the node's /tmp (0600), then removes it.
    alice puts her own file at the same path, with the same size and mtime (both hers to
    set), and runs a job from it on the same node: she must read her bytes. Before, the
    agent took the path record bob's job left (path, size, mtime matched) for her file
    and served bob's blocks from the node's cache."""
    node = "n2"
    local = cluster.dir / "nodes" / node / "local"
    work = cluster.dir / "image-acl"
    work.mkdir(exist_ok=True)
    path = local / f"img-{os.getpid()}.sqsh"
    bobs = _squashfs(work / "src-bob", work / "bob.sqsh", seed=1)
    alices = _squashfs(work / "src-alice", work / "alice.sqsh", seed=2)
    size = max(bobs.stat().st_size, alices.stat().st_size)
    for f in (bobs, alices):  # the same size: zeros after a squashfs's end are ignored
        os.truncate(f, size)
    bob_bytes, alice_bytes = bobs.read_bytes(), alices.read_bytes()
    assert bob_bytes != alice_bytes

    shutil.copyfile(bobs, path)
    os.chown(path, *_ids(cluster, "bob"))
    path.chmod(0o600)
    job = cluster.sbatch("-N1", "-w", node, f"--bootseer-image={path}", script=READ, user="bob")
    assert cluster.wait(job) == "COMPLETED", cluster.output(job)
    assert _sha(bob_bytes) in cluster.output(job)
    mtime_ns = path.stat().st_mtime_ns  # anyone may stat a file in /tmp
    path.unlink()  # bob is done with it

    shutil.copyfile(alices, path)
    os.chown(path, *_ids(cluster, "alice"))
    path.chmod(0o600)
    os.utime(path, ns=(mtime_ns, mtime_ns))  # alice sets her own file's times
    try:
        job = cluster.sbatch("-N1", "-w", node, f"--bootseer-image={path}", script=READ)
        assert cluster.wait(job) == "COMPLETED", cluster.output(job)
        out = cluster.output(job)
        assert _sha(bob_bytes) not in out, "alice's job read bob's private image"
        assert _sha(alice_bytes) in out, out
    finally:
        path.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)


def _ids(cluster: DevSlurm, user: str) -> tuple[int, int]:
    import pwd

    pw = pwd.getpwnam(user)
    return pw.pw_uid, pw.pw_gid


def test_a_huge_sparse_image_is_refused_before_a_byte_is_hashed(cluster: DevSlurm) -> None:
    """mallory names a 4 TiB sparse file that starts with squashfs's magic (instant to
    make, no disk used). The agent (root, outside her allocation) used to register it:
    hash every byte of it and hold a digest per block, 16 million of them, until the
    node's memory ran out, while the prolog gave up and every later prepare of the node
    waited on it. It must refuse it at once, by its size, and stay responsive."""
    node = "n3"
    local = cluster.dir / "nodes" / node / "local"
    path = local / f"huge-{os.getpid()}.sqsh"
    with open(path, "wb") as f:
        f.write(b"hsqs")
        f.truncate(4 << 40)
    os.chown(path, *_ids(cluster, "mallory"))
    try:
        job = cluster.sbatch(
            "-N1",
            "-w",
            node,
            f"--bootseer-image={path}",
            script="#!/bin/sh\ntrue\n",
            user="mallory",
        )
        assert cluster.wait(job, timeout=60) == "COMPLETED", cluster.output(job)
        lines = [ln for ln in cluster.job_log_lines(node, job) if "prolog step=image" in ln]
        assert lines and "outcome=failed" in lines[0], lines
        assert "image.max_image_gib" in lines[0], lines[0]
        assert "registering" not in cluster.node_log(node)
        agent_log = (cluster.dir / "nodes" / node / "log" / f"{node}-agent.log").read_text()
        assert f"registering {path}" not in agent_log, agent_log[-2000:]
        assert cluster.node_states()[node].startswith("idle")
    finally:
        path.unlink(missing_ok=True)


def test_a_user_on_a_jobs_node_gets_nothing_from_its_peer_port(cluster: DevSlurm) -> None:
    """bob's two-node job reads his private image (0600 in his 0700 directory), so n2's
    agent holds its blocks and serves them to the job's other node over the p2p port.
    mallory runs a job on n1, one of his job's nodes (the address the port accepts), and
    asks n2's port for his image's first block, naming his job and the block's digest
    (as if both leaked): without the job's token, which only root's agents derive from
    the site key, she is refused and served nothing."""
    import time
    import tomllib

    from bootseer.config import SiteConfig
    from bootseer.image.manifest import load_manifest
    from bootseer.image.registry import path_key
    from bootseer.p2p.auth import job_token, load_site_key
    from bootseer.sitekey import IMAGE_PATH, load_keys

    work = cluster.dir / "p2p-acl"
    shutil.rmtree(work, ignore_errors=True)
    (work / "bob").mkdir(parents=True)
    work.chmod(0o1777)
    image = _squashfs(work / "src", work / "bob" / "img.sqsh", seed=3)
    for p in (work / "bob", image):
        os.chown(p, *_ids(cluster, "bob"))
    (work / "bob").chmod(0o700)
    image.chmod(0o600)
    done = work / "done"
    bobs = (
        "#!/bin/sh\nset -e\n"
        "srun -N2 sh -c 'cat \"$BOOTSEER_IMAGE\" > /dev/null && echo read-$(hostname)'\n"
        f"i=0; while [ ! -e {done} ]; do i=$((i+1)); [ $i -gt 1200 ] && exit 1; "
        "sleep 0.1; done\n"
    )
    b = cluster.sbatch("-N2", "-w", "n1,n2", f"--bootseer-image={image}", script=bobs, user="bob")
    try:
        deadline = time.monotonic() + 90
        while _output_so_far(cluster, b).count("read-") < 2:  # his blocks are on n2 now
            assert time.monotonic() < deadline, _output_so_far(cluster, b)
            assert cluster.job_state(b) in ("PENDING", "CONFIGURING", "RUNNING"), _output_so_far(
                cluster, b
            )
            time.sleep(0.2)
        store = cluster.cluster.open_store()
        keys = load_keys(cluster.dir / "etc" / "site.key")
        key = path_key(str(image))
        record = json.loads(keys.open(IMAGE_PATH, key, store.read_bytes(key)))
        digest = load_manifest(store, record["image"], keys=keys).blocks[0]
        cfg = SiteConfig.from_mapping(tomllib.loads(cluster.site_config.read_text()))
        addr = cluster.cluster.s.network.node_ip("n2")
        real = job_token(load_site_key(cfg.p2p.key_file), b).hex()
        probe = f"""#!/bin/sh
"$(dirname "$(command -v bootseer)")/python3" - <<'PY'
from bootseer.p2p.auth import job_token
from bootseer.p2p.client import PeerClient
from bootseer.p2p.wire import PeerError, PieceRequest
req = PieceRequest({b}, "", "{digest}", 1)
tokens = (
    ("zeros", bytes(32)),
    ("guessed", job_token(b"mallory's guess", {b})),
    ("real", bytes.fromhex("{real}")),  # the control: what only root's agents hold
)
for name, token in tokens:
    try:
        data = PeerClient(timeout=10).fetch(("{addr}", {cfg.p2p.port}), req, token)
        print(name, "served", len(data))
    except PeerError as exc:
        print(name, "refused", exc.kind)
PY
"""
        m = cluster.sbatch("-N1", "-w", "n1", script=probe, user="mallory")
        assert cluster.wait(m) == "COMPLETED", cluster.output(m)
        out = cluster.output(m)
        lines = out.splitlines()
        assert lines[:2] == ["zeros refused refused", "guessed refused refused"], out
        assert lines[2].startswith("real served "), out  # the address and piece were right
    finally:
        done.touch()
    assert cluster.wait(b) == "COMPLETED", cluster.output(b)
    shutil.rmtree(work, ignore_errors=True)


def _output_so_far(cluster: DevSlurm, job: int) -> str:
    try:
        return cluster.output(job)
    except FileNotFoundError:  # the job has not started
        return ""
