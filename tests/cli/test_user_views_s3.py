"""A user's ``bootseer image show`` and ``deps ls|show`` on an S3 store go through the
node agent, and show only what is hers to see.

Users hold no store credentials and the anonymous identity reaches ``phases/`` only, so
these read the store directly and failed for every user (access denied). The agent
(root) now answers them: ``image show`` for a name whose sealed record verifies, with
the caller's own trace and the name's trace owner's and nobody else's; ``deps ls|show``
in the scopes her jobs restore from (her own by default), a snapshot's manifest only
when it verifies. A path image or an image id, and another user's scope, are refused
in one line. A real agent on slurm-dev's S3 store host (SeaweedFS) and its users."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bootseer.deps.capture import CaptureRequest, capture
from bootseer.image.manifest import upload_file
from bootseer.image.registry import tag_image
from bootseer.image.trace import Trace, save_trace
from tests.conftest import devcluster
from tests.imagekit import AgentProc, make_squashfs, site_config
from tests.sitekeys import KEYS

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.s3,
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


@dataclass
class Views:
    agent: AgentProc
    image: str  # a name, trace owner bob
    image_id: str
    alices: str  # a snapshot key in user/alice
    malloris: str  # one in user/mallory

    def run(self, who: str, *argv: str) -> subprocess.CompletedProcess[str]:
        user(who)
        return subprocess.run(
            [
                *(
                    []
                    if who == "root"
                    else ["setpriv", f"--reuid={who}", f"--regid={who}", "--init-groups"]
                ),
                "env",
                f"BOOTSEER_CONFIG={self.agent.config_path}",
                f"SLURMD_NODENAME={self.agent.node}",
                BOOTSEER,
                *argv,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )


def _snapshot(store: object, base: Path, who: str) -> str:
    """A sealed snapshot of a small prefix of ``who``'s in ``user/<who>``; its key."""
    pw = user(who)
    prefix = base / f"{who}-prefix"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "tool").write_text(f"{who}'s tool\n")
    for p in (prefix, prefix / "bin", prefix / "bin" / "tool"):
        os.chown(p, pw.pw_uid, pw.pw_gid)
    key = uuid.uuid4().hex
    capture(
        store,  # type: ignore[arg-type]
        CaptureRequest(
            prefix=str(prefix),
            scope=f"user/{who}",
            base=uuid.uuid4().hex,
            key=key,
            uid=pw.pw_uid,
            gid=pw.pw_gid,
            user=who,
            command=["pip", "install", f"{who}-secret-package"],
        ),
        keys=KEYS,
    )
    return key


@pytest.fixture
def views(s3_store: devcluster.Cluster, base: Path) -> Iterator[Views]:
    for who in ("alice", "bob", "mallory"):
        user(who)
    store = s3_store.open_store()
    squashfs = make_squashfs(base / "img.sqsh", {"a": 300_000}, seed=31)
    m = upload_file(store, str(squashfs), 64 << 10, keys=KEYS)
    name = f"views-{uuid.uuid4().hex[:12]}:1"
    tag_image(store, name, m, keys=KEYS, trace_owner="bob")
    for who, blocks in (("alice", (0,)), ("bob", (0, 1)), ("mallory", (0, 1, 2))):
        trace = Trace(m.id, m.nblocks, m.block_size, blocks)
        save_trace(store, trace, keys=KEYS, user=who)
    alices, malloris = _snapshot(store, base, "alice"), _snapshot(store, base, "mallory")
    config = site_config(base)
    config["store"]["uri"] = s3_store.store_uri()
    config["store"]["secrets_file"] = str(s3_store.secrets_file)
    agent = AgentProc(base, "t1", config)
    agent.config_path.chmod(0o644)
    agent.start()
    try:
        yield Views(agent, name, m.id, alices, malloris)
    finally:
        agent.stop()


def one_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode != 0, r.stdout
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    return r.stderr


def test_image_show_gives_a_user_the_name_and_the_traces_her_jobs_use(views: Views) -> None:
    for who, mine in (("alice", 1), ("mallory", 3)):
        r = views.run(who, "image", "show", views.image)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["image"] == views.image_id and doc["trace_owner"] == "bob", doc
        # Her own trace and the trace owner's, which her jobs prefetch first: no other's.
        assert sorted(doc["traces"]) == sorted({who, "bob"}), doc
        assert doc["traces"][who]["blocks"] == mine and doc["traces"]["bob"]["blocks"] == 2
    # An image id or a path may be anyone's path image: root's view, said in one line.
    for ref in (views.image_id, "/home/bob/secret.sqsh"):
        err = one_line(views.run("mallory", "image", "show", ref))
        assert "root's `bootseer image show`" in err, err
    err = one_line(views.run("alice", "image", "show", "no-such-image:1"))
    assert "no image named" in err, err
    # Root still reads the store itself: every user's trace.
    r = views.run("root", "image", "show", views.image)
    assert r.returncode == 0, r.stderr
    assert {"alice", "bob", "mallory"} <= set(json.loads(r.stdout)["traces"]), r.stdout


def test_deps_ls_and_show_give_a_user_her_own_snapshots_only(views: Views) -> None:
    r = views.run("alice", "deps", "ls")
    assert r.returncode == 0, r.stderr
    assert "scope user/alice" in r.stdout and views.alices in r.stdout, r.stdout
    assert views.malloris not in r.stdout and "mallory" not in r.stdout, r.stdout
    r = views.run("alice", "deps", "show", views.alices, "--files")
    assert r.returncode == 0, r.stderr
    assert f"snapshot  {views.alices} (user/alice)" in r.stdout, r.stdout
    assert "alice-secret-package" in r.stdout and "bin/tool" in r.stdout, r.stdout
    # mallory: her own, never alice's, whichever way she asks.
    r = views.run("mallory", "deps", "ls")
    assert r.returncode == 0, r.stderr
    assert views.malloris in r.stdout and views.alices not in r.stdout, r.stdout
    for argv in (
        ("deps", "ls", "--scope", "user/alice"),
        ("deps", "show", views.alices, "--scope", "user/alice"),
        ("deps", "ls", "--scope", "cluster"),  # the site allows no cluster scope here
    ):
        err = one_line(views.run("mallory", *argv))
        assert "is not one your jobs restore from (yours: user/mallory)" in err or (
            "another user's" in err
        ), err
        assert "alice-secret-package" not in err
    err = one_line(views.run("mallory", "deps", "show", views.alices))
    assert f"no snapshot {views.alices} in scope user/mallory" in err, err
    # Root reads the store itself, every scope.
    r = views.run("root", "deps", "ls", "--all")
    assert views.alices in r.stdout and views.malloris in r.stdout, r.stdout + r.stderr


def test_without_an_agent_a_user_is_told_where_to_run_it(views: Views) -> None:
    views.agent.stop()
    for argv, said in (
        (("image", "show", views.image), "srun bootseer image show NAME"),
        (("deps", "ls"), "srun bootseer deps ls"),
        (("deps", "show", views.alices), "srun bootseer deps show"),
    ):
        err = one_line(views.run("alice", *argv))
        assert "node agent" in err and said in err, err
