"""Image records are sealed by root-run writers (``bootseer image add`` as root, the agent);
the agent refuses a name record, manifest, path record or trace that someone without the
site key planted or altered in the store (docs/security.md). Real agent, real FUSE."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from bootseer.agentapi.errors import AgentError
from bootseer.image.manifest import load_manifest, manifest_key, upload_file
from bootseer.image.registry import name_key, path_key, tag_image
from bootseer.image.trace import Trace, trace_key
from bootseer.sitekey import IMAGE_MANIFEST, IMAGE_NAME, IMAGE_PATH, SealError, strip
from bootseer.store import open_store
from tests.imagekit import add_image, make_squashfs, running_agent
from tests.sitekeys import KEYS

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("mksquashfs") or not os.path.exists("/dev/fuse"),
        reason="needs root, /dev/fuse and squashfs-tools",
    ),
]


def test_image_add_seals_and_the_agent_serves_it(base: Path) -> None:
    image = make_squashfs(base / "img.sqsh", {"a": 300_000})
    image_id = add_image(base, image, "good:1")
    store = open_store(f"file://{base}/store")
    KEYS.open(IMAGE_NAME, name_key("good:1"), store.read_bytes(name_key("good:1")))
    KEYS.open(IMAGE_MANIFEST, manifest_key(image_id), store.read_bytes(manifest_key(image_id)))
    with running_agent(base) as agent:
        got = agent.prepare(1, "good:1")
        assert Path(got["path"]).read_bytes() == image.read_bytes()
        agent.release(1)


def test_a_repointed_name_record_is_refused(base: Path) -> None:
    """mallory uploads her own image (blocks and manifest, unsealed: she has no key) and
    points the shared name at it; the agent refuses the name, not serve her image."""
    good = make_squashfs(base / "good.sqsh", {"a": 300_000}, seed=1)
    evil = make_squashfs(base / "evil.sqsh", {"a": 300_000}, seed=2)
    add_image(base, good, "shared:1")
    store = open_store(f"file://{base}/store")
    m = upload_file(store, str(evil), 64 << 10, keys=None)
    tag_image(store, "shared:1", m, keys=None)
    with running_agent(base) as agent:
        with pytest.raises(AgentError, match="not sealed with the site key"):
            agent.prepare(1, "shared:1")
        # A sealed name record copied from another name does not open here either.
        add_image(base, good, "other:1")
        store.write_bytes(name_key("shared:1"), store.read_bytes(name_key("other:1")))
        with pytest.raises(AgentError, match="does not verify"):
            agent.prepare(2, "shared:1")
        # Nor does a genuine record whose manifest was swapped for an unsealed one.
        add_image(base, good, "shared:1")
        m_good = load_manifest(
            store, json.loads(strip(store.read_bytes(name_key("shared:1"))))["image"], keys=KEYS
        )
        store.write_bytes(manifest_key(m_good.id), m_good.to_json())
        with pytest.raises(AgentError, match="not sealed"):
            agent.prepare(3, "shared:1")


def test_a_planted_path_record_is_ignored_and_the_file_registered_anew(base: Path) -> None:
    image = make_squashfs(base / "img.sqsh", {"a": 300_000}, seed=3)
    evil = make_squashfs(base / "evil.sqsh", {"a": 300_000}, seed=4)
    store = open_store(f"file://{base}/store")
    st = image.stat()
    m_evil = upload_file(store, str(evil), 64 << 10, keys=None)
    doc = {"path": str(image), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "image": m_evil.id}
    store.write_bytes(path_key(str(image)), json.dumps(doc).encode())
    with running_agent(base) as agent:
        got = agent.prepare(1, str(image))
        assert got["image"] != m_evil.id
        assert Path(got["path"]).read_bytes() == image.read_bytes()
        agent.release(1)
    # The agent's own record replaced the planted one, sealed.
    record = store.read_bytes(path_key(str(image)))
    assert json.loads(KEYS.open(IMAGE_PATH, path_key(str(image)), record))["image"] == got["image"]


def test_a_planted_trace_is_ignored_and_replaced_by_a_sealed_one(base: Path) -> None:
    image = make_squashfs(base / "img.sqsh", {"a": 1_000_000}, seed=5)
    image_id = add_image(base, image, "t:1")
    store = open_store(f"file://{base}/store")
    m = load_manifest(store, image_id, keys=KEYS)
    planted = Trace(image_id, m.nblocks, m.block_size, tuple(range(m.nblocks)))  # all hot
    store.write_bytes(trace_key(image_id, "root"), planted.to_json())
    with running_agent(base) as agent:
        got = agent.prepare(1, "t:1")
        assert got["trace_runs"] == 0 and got["prefetch"]["hot_blocks"] == 0
        assert "not sealed with the site key" in agent.log_text()
        with open(got["path"], "rb") as f:
            f.read(10)
        assert agent.release(1)["trace"].startswith("saved")
    with pytest.raises(SealError):
        KEYS.open(
            "image.manifest",
            trace_key(image_id, "root"),
            store.read_bytes(trace_key(image_id, "root")),
        )
    raw = KEYS.open(
        "image.trace", trace_key(image_id, "root"), store.read_bytes(trace_key(image_id, "root"))
    )
    assert len(Trace.from_json(raw, image_id, m.nblocks, m.block_size).blocks) < m.nblocks
