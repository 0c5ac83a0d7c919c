"""What hashing a user's path image may cost the node agent (issue 21 item 7).

On main a sparse path image under 256 GiB cost mallory 4 KB of disk and the agent the
hashing of all of it, any number at once, and the hashing went on after the prolog
gave up and the job ended (2x16 GiB: 38 CPU-s, 15 s past both jobs' end)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from bootseer.agent.hashing import HashBudget
from bootseer.agentapi.errors import AgentPending
from bootseer.image.registry import path_key, register_path
from bootseer.store import open_store
from tests.imagekit import running_agent
from tests.sitekeys import KEYS

MALLORY = 4545


@pytest.mark.fuse
@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/dev/fuse"), reason="needs root and /dev/fuse"
)
def test_a_sparse_path_image_is_refused_before_a_byte_is_hashed(base: Path) -> None:
    home = base / "mallory"
    home.mkdir()
    image = home / "img.sqsh"
    with open(image, "wb") as f:
        f.write(b"hsqs")
        f.truncate(1 << 30)  # 1 GiB, under image.max_image_gib, 4 KiB on her disk
    for p in (home, image):
        os.chown(p, MALLORY, MALLORY)
    with running_agent(base) as agent:
        with pytest.raises(Exception, match="is a sparse file"):
            agent.prepare(1, str(image), uid=MALLORY, gid=MALLORY)
        assert f"registering {image}" not in agent.log_text()


def dense_file(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        for _ in range(size // (1 << 20)):
            f.write(os.urandom(1 << 20))
    return path


def test_the_hashing_stops_when_its_job_ends_and_leaves_nothing(tmp_path: Path) -> None:
    """The epilog's release cancels the job's hashing mid-file: no record is written,
    the registration lock is freed for the next job, the user's slot is given back."""
    store = open_store(f"file://{tmp_path}/store")
    image = dense_file(tmp_path / "img.sqsh", 8 << 20)
    st = os.stat(image)
    budget = HashBudget()
    hashing, ended = threading.Event(), threading.Event()
    seen: list[int] = []
    stopped = pytest.raises(AgentPending, match="job 7 ended: hashing")
    with stopped, budget.slot(7, MALLORY, str(image)) as progress:

        def hook(done: int, total: int, uploaded: int) -> None:
            seen.append(done)
            hashing.set()
            assert ended.wait(60)  # the epilog comes while the file is being hashed
            progress(done, total, uploaded)

        def epilog() -> None:
            assert hashing.wait(60)
            assert budget.cancel(7)
            ended.set()

        t = threading.Thread(target=epilog)
        t.start()
        try:
            register_path(store, str(image), st, 64 << 10, 5.0, keys=KEYS, progress=hook)
        finally:
            t.join()
    assert len(seen) == 1  # not one block more once the job was gone
    assert not store.exists(path_key(str(image)))
    assert not list(store.list("images/locks", recursive=True))
    assert budget.running() == 0
    manifest = register_path(store, str(image), st, 64 << 10, 5.0, keys=KEYS)
    assert manifest.size == 8 << 20  # the next job registers it


def test_one_user_hashes_one_image_at_a_time_and_the_node_two() -> None:
    budget = HashBudget()
    with budget.slot(1, 1001, "/a/1.sqsh"):
        user_bound = pytest.raises(AgentPending, match="uid 1001 already has 1 path image")
        with user_bound, budget.slot(2, 1001, "/a/2.sqsh"):
            pass
        node_bound = pytest.raises(AgentPending, match="2 path images are being hashed")
        with budget.slot(3, 1002, "/b/1.sqsh"), node_bound, budget.slot(4, 1003, "/c/1.sqsh"):
            pass
    with budget.slot(2, 1001, "/a/2.sqsh"):
        assert budget.running() == 1
