"""A user's ``bootseer image ls`` goes through the node agent: users hold no store
credentials and may not read ``images/`` (on S3 the anonymous identity reaches
``phases/`` only; on a file:// store the records are root's, 0600), so their listing
failed. The agent (root) lists the names whose sealed records verify, to any user (a
name is published to every job user), and no path image (other users' files).
A real agent and slurm-dev's users, no Slurm."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer.image.manifest import upload_file
from bootseer.image.registry import tag_image
from bootseer.store import open_store
from tests.imagekit import AgentProc, add_image, make_squashfs, running_agent

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.skipif(
        os.geteuid() != 0 or not os.path.exists("/dev/fuse") or not shutil.which("setpriv"),
        reason="needs root, /dev/fuse and setpriv",
    ),
]
BOOTSEER = str(Path(sys.executable).parent / "bootseer")


def user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pytest.skip(f"needs slurm-dev's user {name} (slurm-dev/up creates them)")


def image_ls(name: str, agent: AgentProc, *argv: str) -> subprocess.CompletedProcess[str]:
    user(name)
    return subprocess.run(
        [
            "setpriv",
            f"--reuid={name}",
            f"--regid={name}",
            "--init-groups",
            "env",
            f"BOOTSEER_CONFIG={agent.config_path}",
            f"SLURMD_NODENAME={agent.node}",
            BOOTSEER,
            "image",
            "ls",
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_user_lists_the_sealed_names_through_the_agent_and_no_path(base: Path) -> None:
    good = make_squashfs(base / "good.sqsh", {"a": 200_000}, seed=21)
    image_id = add_image(base, good, "pytorch:24.05")
    store = open_store(f"file://{base}/store")
    # A name someone without the site key planted: no job is served it, so none is listed.
    tag_image(store, "planted:1", upload_file(store, str(good), 64 << 10, keys=None), keys=None)
    secret = make_squashfs(base / "bobs-secret-model.sqsh", {"a": 100_000}, seed=22)
    bob = user("bob")
    os.chown(secret, bob.pw_uid, bob.pw_gid)
    secret.chmod(0o600)
    with running_agent(base) as agent:
        agent.prepare(1, str(secret), uid=bob.pw_uid, gid=bob.pw_gid)  # registers the path
        agent.release(1)
        r = image_ls("mallory", agent)
        assert r.returncode == 0, r.stderr
        assert "pytorch:24.05" in r.stdout and image_id[:12] in r.stdout, r.stdout
        assert "planted" not in r.stdout and "secret" not in r.stdout, r.stdout
        doc = json.loads(image_ls("alice", agent, "--json").stdout)
        assert (
            list(doc["names"]) == ["pytorch:24.05"]
            and doc["names"]["pytorch:24.05"]["image"] == image_id
        )
        # root still lists from the store, path images included.
        root = subprocess.run(
            [BOOTSEER, "image", "ls"],
            env={**os.environ, "BOOTSEER_CONFIG": str(agent.config_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "pytorch:24.05" in root.stdout and "bobs-secret-model" in root.stdout, root
    # No agent here (a login node): one line saying where to run it.
    r = image_ls("alice", agent)
    assert r.returncode != 0
    assert "node agent" in r.stderr and "srun bootseer image ls" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
