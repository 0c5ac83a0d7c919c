"""The agent against the real S3 store host (SeaweedFS behind its capped link)."""

from __future__ import annotations

import errno
import os
import signal
import time
from pathlib import Path

import pytest

from bootseer.image.manifest import upload_file
from bootseer.image.registry import tag_image
from tests.conftest import devcluster
from tests.imagekit import AgentProc, make_squashfs, site_config
from tests.sitekeys import KEYS

pytestmark = [pytest.mark.fuse, pytest.mark.s3]


def test_hung_store_gives_eio_after_a_bounded_wait(
    s3_store: devcluster.Cluster, tmp_path: Path
) -> None:
    (tmp_path / "log").mkdir()
    image = make_squashfs(tmp_path / "img.sqsh", {"a": 3_000_000})
    store = s3_store.open_store()
    manifest = upload_file(store, str(image), 64 << 10, keys=KEYS)
    tag_image(store, "hang:1", manifest, keys=KEYS)
    config = site_config(tmp_path, fetch_timeout=3.0)
    config["store"]["uri"] = s3_store.store_uri()
    config["store"]["secrets_file"] = str(s3_store.secrets_file)
    agent = AgentProc(tmp_path, "t1", config)
    weed = s3_store.alive("weed")
    assert weed
    stopped = False
    try:
        agent.start()
        lazy = Path(agent.prepare(1, "hang:1")["path"])
        with open(lazy, "rb") as f:
            assert f.read(4) == b"hsqs"  # the store answers
        os.kill(weed, signal.SIGSTOP)  # the store hangs: connections open, no answers
        stopped = True
        fd = os.open(lazy, os.O_RDONLY)
        try:
            t0 = time.monotonic()
            with pytest.raises(OSError) as exc:
                os.pread(fd, 4096, 2_000_000)
            waited = time.monotonic() - t0
        finally:
            os.close(fd)
        assert exc.value.errno == errno.EIO
        # The 3 s fetch timeout ends the wait; 20 s (under the 30 s default) bounds a
        # hang, not a speed.
        assert waited < 20.0, waited
        os.kill(weed, signal.SIGCONT)
        stopped = False
        deadline = time.monotonic() + 60
        while True:  # the stuck requests time out in the S3 client; then reads work again
            try:
                assert lazy.read_bytes() == image.read_bytes()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        agent.release(1)
    finally:
        if stopped:
            os.kill(weed, signal.SIGCONT)
        agent.stop()
