"""Whose trace a job prefetches: its image owner's, then its own user's; never another
user's (docs/security.md, "Image traces"). A trace was one per image, written by the
epilog of whichever job used it last: mallory's job reading the whole image made every
later job of the image, alice's included, prefetch all of it first (or, reading blocks
alice never needs, push hers back). Real agent, real FUSE; jobs of alice, bob, mallory."""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

import pytest

from bootseer.image.manifest import load_manifest
from bootseer.image.trace import Trace, trace_key
from bootseer.sitekey import IMAGE_TRACE
from bootseer.store import open_store
from tests.imagekit import AgentProc, add_image, make_squashfs, running_agent
from tests.sitekeys import KEYS

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("mksquashfs") or not os.path.exists("/dev/fuse"),
        reason="needs root, /dev/fuse and squashfs-tools",
    ),
]


def uid(user: str) -> int:
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        pytest.skip(f"no user {user} (slurm-dev/up creates alice, bob and mallory)")


def job(agent: AgentProc, job_id: int, ref: str, user: str, whole: bool = False) -> int:
    """A job of ``user``: prepare, read the image's start (or all of it), release. Returns
    the number of blocks it prefetched."""
    got = agent.prepare(job_id, ref, uid=uid(user), gid=uid(user))
    with open(got["path"], "rb") as f:
        if whole:
            f.read()
        else:
            f.read(10)
    agent.release(job_id)
    return int(got["prefetch"]["hot_blocks"])


def test_mallorys_job_does_not_change_what_alices_next_job_prefetches(base: Path) -> None:
    image = make_squashfs(base / "img.sqsh", {"a": 1_000_000}, seed=11)
    image_id = add_image(base, image, "shared:1")
    store = open_store(f"file://{base}/store")
    with running_agent(base) as agent:
        assert job(agent, 1, "shared:1", "alice") == 0
        alices = job(agent, 2, "shared:1", "alice")  # her own trace, from job 1
        assert 0 < alices < 10
        # mallory's job reads every block: before, the image's one trace became hers.
        job(agent, 3, "shared:1", "mallory", whole=True)
        # alice's next job prefetches her own trace as it now is (her job 2 may have added
        # a block the kernel read ahead under load), never mallory's whole image.
        m = load_manifest(store, image_id, keys=KEYS)
        key = trace_key(image_id, "alice")
        hers = Trace.from_json(KEYS.open(IMAGE_TRACE, key, store.read_bytes(key)), image_id,
                               m.nblocks, m.block_size).blocks  # fmt: skip
        assert alices <= len(hers) < m.nblocks
        assert job(agent, 4, "shared:1", "alice") == len(hers)
        # bob has no trace of his own and the name no owner: mallory's reaches him neither.
        assert job(agent, 5, "shared:1", "bob") == 0
        assert "mallory's" not in agent.log_text()
    # Each trace sealed at its own user's key: mallory's cannot stand in for alice's.
    mallorys = store.read_bytes(trace_key(image_id, "mallory"))
    store.write_bytes(trace_key(image_id, "alice"), mallorys)
    with running_agent(base) as agent:
        assert job(agent, 6, "shared:1", "alice") == 0
        assert "does not verify" in agent.log_text()


def test_a_named_images_trace_owner_leads_every_users_prefetch(base: Path) -> None:
    image = make_squashfs(base / "img.sqsh", {"a": 1_000_000}, seed=12)
    image_id = add_image(base, image, "team:1", 64, "--trace-owner", "alice")
    store = open_store(f"file://{base}/store")
    with running_agent(base) as agent:
        job(agent, 1, "team:1", "alice")
        key = trace_key(image_id, "alice")
        m = load_manifest(store, image_id, keys=KEYS)
        raw = KEYS.open(IMAGE_TRACE, key, store.read_bytes(key))
        alices = Trace.from_json(raw, image_id, m.nblocks, m.block_size).blocks
        assert job(agent, 2, "team:1", "bob") == len(alices)  # the owner's trace
        job(agent, 3, "team:1", "mallory", whole=True)
        assert job(agent, 4, "team:1", "bob") == len(alices)  # bob's own adds nothing new
        assert job(agent, 5, "team:1", "alice") == len(alices)
        # mallory's own jobs follow the owner's trace, then her own blocks.
        assert job(agent, 6, "team:1", "mallory") > len(alices)


def test_a_path_images_trace_owner_is_the_files_owner(base: Path) -> None:
    image = make_squashfs(base / "img.sqsh", {"a": 1_000_000}, seed=13)
    os.chown(image, uid("alice"), uid("alice"))  # alice's file, readable by all (0644)
    with running_agent(base) as agent:
        job(agent, 1, str(image), "mallory", whole=True)
        assert job(agent, 2, str(image), "bob") == 0  # not mallory's
        job(agent, 3, str(image), "alice")
        alices = job(agent, 4, str(image), "alice")
        assert 0 < alices < 10
        assert job(agent, 5, str(image), "bob") == alices  # the file owner's


def test_a_root_owned_path_images_trace_owner_is_the_sites_choice(base: Path) -> None:
    """root runs no jobs, so a root-owned path image's trace owner (root) has no trace:
    each user's jobs start from their own. ``[image] root_path_trace_owner`` names
    whose trace leads instead (root-owned files only)."""
    image = make_squashfs(base / "img.sqsh", {"a": 1_000_000}, seed=14)  # root's, 0644
    with running_agent(base) as agent:
        job(agent, 1, str(image), "alice")
        alices = job(agent, 2, str(image), "alice")
        assert 0 < alices < 10
        assert job(agent, 3, str(image), "mallory") == 0  # root's trace: none
    with running_agent(base, root_path_trace_owner="alice") as agent:
        assert job(agent, 4, str(image), "bob") == alices  # alice's leads (bob has none)
        job(agent, 5, str(image), "mallory", whole=True)
        assert job(agent, 6, str(image), "bob") == alices  # mallory's reaches him not
        # A file of another user keeps its owner's trace, whatever the setting.
        theirs = make_squashfs(base / "bobs.sqsh", {"a": 1_000_000}, seed=15)
        os.chown(theirs, uid("bob"), uid("bob"))
        job(agent, 7, str(theirs), "alice")
        assert job(agent, 8, str(theirs), "mallory") == 0  # bob has no trace of it
