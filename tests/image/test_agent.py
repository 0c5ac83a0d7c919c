"""The node agent with real FUSE and real squashfs images (no Slurm needed)."""

from __future__ import annotations

import concurrent.futures as cf
import errno
import os
import random
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from bootseer import mounts
from bootseer.agentapi.errors import AgentError
from bootseer.image.blocks import block_key
from bootseer.image.cache import blocks_on_disk
from bootseer.image.manifest import load_manifest
from bootseer.image.trace import Trace, save_trace, trace_key
from bootseer.sitekey import IMAGE_TRACE
from bootseer.store import open_store
from tests.imagekit import AgentProc, add_image, make_squashfs, running_agent, site_config
from tests.sitekeys import KEYS
from tests.waiting import wait_until

# A read with a 3 s fetch timeout ends well within this: a bound on a hang (and under the
# 30 s default, so a timeout not taken from the config fails), not a speed claim.
HANG = 20.0

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("mksquashfs") or not os.path.exists("/dev/fuse"),
        reason="needs root, /dev/fuse and squashfs-tools",
    ),
]

FILES = {"bin/tool": 300_000, "lib/big.so": 1_500_000, "share/data": 700_000, "etc/conf": 5000}


# ``base`` is conftest's: a directory of its own under /tmp that job users may enter.
# Under pytest's tmp_path, another root pytest session resets /tmp/pytest-of-root to
# 0700 at any moment, and a job user's call then met "Permission denied" on the socket.


@pytest.fixture
def image(base: Path) -> Path:
    return make_squashfs(base / "img.sqsh", FILES)


def random_reads(path: Path, original: bytes, n: int, seed: int) -> None:
    rng = random.Random(seed)
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(n):
            off = rng.randrange(0, len(original))
            size = rng.choice([1, 100, 4096, 65536, 200_000, 1 << 20])
            # O_DIRECT is not needed: keep_cache may serve repeats, which must match too.
            assert os.pread(fd, size, off) == original[off : off + size], (off, size)
    finally:
        os.close(fd)


def test_byte_identical_under_random_and_concurrent_reads(base: Path, image: Path) -> None:
    add_image(base, image, "test:1")
    original = image.read_bytes()
    with running_agent(base) as agent:
        lazy = Path(agent.prepare(1, "test:1")["path"])
        with cf.ThreadPoolExecutor(8) as pool:
            for f in [pool.submit(random_reads, lazy, original, 60, s) for s in range(8)]:
                f.result()
        assert lazy.read_bytes() == original
        stats = agent.stats()
        # One fetch per block however many readers asked: never more fetches than blocks.
        nblocks = -(-len(original) // 65536)
        assert stats["fetched_blocks"] <= nblocks
        agent.release(1)


def test_path_image_is_registered_once_and_read_from_the_file(base: Path, image: Path) -> None:
    original = image.read_bytes()
    with running_agent(base) as agent:
        with cf.ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda j: agent.prepare(j, str(image)), range(1, 7)))
        assert len({a["image"] for a in answers}) == 1
        assert agent.log_text().count(f"registering {image}") == 1
        assert Path(answers[3]["path"]).read_bytes() == original
        for j in range(1, 7):
            agent.release(j)


def test_fuse_files_cannot_be_written(base: Path, image: Path) -> None:
    add_image(base, image, "test:1")
    with running_agent(base) as agent:
        lazy = Path(agent.prepare(1, "test:1")["path"])
        for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC):
            with pytest.raises(OSError) as exc:
                os.open(lazy, flags)
            assert exc.value.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
        with pytest.raises(OSError):
            os.chmod(lazy, 0o666)
        with pytest.raises(OSError):
            os.truncate(lazy, 0)
        with pytest.raises(OSError):
            (agent.mount / "new.sqsh").write_bytes(b"x")
        with pytest.raises(OSError):
            os.unlink(lazy)
        assert lazy.read_bytes() == image.read_bytes()
        agent.release(1)


def test_job_file_belongs_to_the_job_user_and_others_cannot_read(base: Path, image: Path) -> None:
    add_image(base, image, "test:1")
    with running_agent(base) as agent:
        lazy = Path(agent.prepare(5, "test:1", uid=4242, gid=4242)["path"])
        st = lazy.stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (4242, 4242, 0o400)
        other = subprocess.run(
            ["setpriv", "--reuid=4343", "--regid=4343", "--clear-groups", "head", "-c4", str(lazy)],
            capture_output=True,
        )
        assert other.returncode != 0
        owner = subprocess.run(
            ["setpriv", "--reuid=4242", "--regid=4242", "--clear-groups", "head", "-c4", str(lazy)],
            capture_output=True,
        )
        assert owner.stdout == b"hsqs"
        agent.release(5)


def test_non_root_caller_may_ask_only_about_its_own_jobs(base: Path, image: Path) -> None:
    add_image(base, image, "test:1")
    with running_agent(base) as agent:
        agent.prepare(5, "test:1", uid=4242, gid=4242)
        agent.prepare(6, "test:1", uid=4343, gid=4343)
        code = (
            "import sys; from pathlib import Path\n"
            "from bootseer.agentapi.client import AgentClient\n"
            f"c = AgentClient(Path({str(agent.socket)!r}))\n"
            "for op, job in [('status', 5), ('first_step', 5), ('status', 6), ('release', 5),"
            " ('prepare', 7)]:\n"
            "    try:\n"
            "        c.call(op, job_id=job); print(op, job, 'ok')\n"
            "    except Exception as e:\n"
            "        print(op, job, 'refused', repr(e), file=sys.stderr)\n"
            "        print(op, job, 'refused')\n"
        )
        import sys

        r = subprocess.run(
            [
                "setpriv",
                "--reuid=4242",
                "--regid=4242",
                "--clear-groups",
                sys.executable,
                "-c",
                code,
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        assert r.stdout.split("\n")[:5] == [
            "status 5 ok",
            "first_step 5 ok",
            "status 6 refused",
            "release 5 refused",
            "prepare 7 refused",
        ], r.stderr  # why each was refused
        agent.release(5)
        agent.release(6)


def test_user_may_not_prepare_an_image_file_they_cannot_read(base: Path, image: Path) -> None:
    image.chmod(0o600)
    with running_agent(base) as agent, pytest.raises(AgentError, match="not readable by uid"):
        agent.prepare(1, str(image), uid=4242, gid=4242)


def test_eviction_while_in_use_keeps_reads_correct(base: Path, image: Path) -> None:
    add_image(base, image, "test:1")
    original = image.read_bytes()
    cap_blocks = 6
    with running_agent(base, cache_size_gib=cap_blocks * 65536 / 2**30) as agent:
        lazy = Path(agent.prepare(1, "test:1")["path"])
        with cf.ThreadPoolExecutor(4) as pool:
            for f in [pool.submit(random_reads, lazy, original, 40, s) for s in range(4)]:
                f.result()
        stats = agent.stats()
        assert stats["evicted"] > 0
        assert stats["cache_bytes"] <= cap_blocks * 65536
        assert sum(w.size for w in blocks_on_disk(agent.cache).values()) <= cap_blocks * 65536
        # Evicted blocks' bytes are punched out of their packs: the disk has them back.
        packs = list((agent.cache / "packs").glob("*.pack"))
        assert sum(p.stat().st_blocks * 512 for p in packs) <= (cap_blocks + 1) * 65536
        agent.release(1)


def test_eviction_takes_blocks_of_unused_images_first(base: Path) -> None:
    a = make_squashfs(base / "a.sqsh", {"a": 600_000}, seed=1)
    b = make_squashfs(base / "b.sqsh", {"b": 600_000}, seed=2)
    add_image(base, a, "a:1")
    add_image(base, b, "b:1")
    store = open_store(f"file://{base}/store")
    with running_agent(base, cache_size_gib=16 * 65536 / 2**30) as agent:
        assert Path(agent.prepare(2, "b:1")["path"]).read_bytes() == b.read_bytes()
        agent.release(2)  # b is now used by no job: its blocks go first
        used = agent.prepare(1, "a:1")
        assert Path(used["path"]).read_bytes() == a.read_bytes()
        ma = load_manifest(store, used["image"], keys=KEYS)
        cached = set(blocks_on_disk(agent.cache))
        assert set(ma.blocks) <= cached, "a block of the image in use was evicted"
        assert agent.stats()["evicted"] > 0
        agent.release(1)


def test_restart_keeps_the_verified_cache_and_the_prepared_jobs(base: Path, image: Path) -> None:
    add_image(base, image, "test:1")
    original = image.read_bytes()
    with running_agent(base) as agent:
        lazy = Path(agent.prepare(1, "test:1")["path"])
        assert lazy.read_bytes() == original
        fetched = agent.stats()["fetched_blocks"]
        assert fetched > 0
        agent.stop()
        # A block damaged on disk while the agent was down is caught on its first read.
        victim = next(iter(blocks_on_disk(agent.cache).values()))
        with open(victim.path, "r+b") as f:
            f.seek(victim.offset)
            f.write(b"\0" * victim.size)
        agent.start()
        stats = agent.stats()
        assert stats["cache_blocks"] == fetched and stats["jobs"] == [1]
        assert lazy.read_bytes() == original  # the job's path works again after the restart
        again = agent.prepare(2, "test:1")
        assert Path(again["path"]).read_bytes() == original
        assert agent.stats()["fetched_blocks"] == 1  # only the damaged block came again
        agent.release(1)
        agent.release(2)


def test_store_down_gives_eio_after_a_bounded_wait(base: Path, image: Path) -> None:
    add_image(base, image, "test:1")
    with running_agent(base, fetch_timeout=3.0) as agent:
        lazy = Path(agent.prepare(1, "test:1")["path"])
        (base / "store").rename(base / "store.away")  # the shared store is gone
        try:
            fd = os.open(lazy, os.O_RDONLY)
            t0 = time.monotonic()
            with pytest.raises(OSError) as exc:
                os.pread(fd, 4096, 1_000_000)
            waited = time.monotonic() - t0
            os.close(fd)
            assert exc.value.errno == errno.EIO
            assert waited < HANG, waited
        finally:
            (base / "store.away").rename(base / "store")
        assert lazy.read_bytes() == image.read_bytes()  # back once the store is
        agent.release(1)


def test_corrupt_block_is_refused_and_fetched_again(base: Path, image: Path) -> None:
    image_id = add_image(base, image, "test:1")
    store = open_store(f"file://{base}/store")
    m = load_manifest(store, image_id, keys=KEYS)
    key = block_key(m.blocks[3])
    good = store.read_bytes(key)
    store_file = base / "store" / key
    store_file.write_bytes(b"X" * len(good))
    original = image.read_bytes()
    with running_agent(base, fetch_timeout=20.0) as agent:
        lazy = Path(agent.prepare(1, "test:1")["path"])
        got: list[bytes] = []
        reader = threading.Thread(
            target=lambda: got.append(os.pread(os.open(lazy, os.O_RDONLY), 100, 3 * 65536 + 10))
        )
        reader.start()
        wait_until(lambda: agent.stats()["corrupt_refused"] >= 1, "the corrupt block refused")
        store_file.write_bytes(good)  # the store heals; the retry gets the right bytes
        reader.join(60)
        assert got == [original[3 * 65536 + 10 : 3 * 65536 + 110]]
        assert "digest mismatch" in agent.log_text()
        assert lazy.read_bytes() == original
        agent.release(1)


def test_trace_is_saved_then_prefetched_then_merged(base: Path, image: Path) -> None:
    image_id = add_image(base, image, "test:1")
    store = open_store(f"file://{base}/store")
    original = image.read_bytes()
    with running_agent(base) as agent:
        first = Path(agent.prepare(1, "test:1")["path"])
        with open(first, "rb") as f:
            f.seek(200_000)
            f.read(10)
            f.seek(0)
            f.read(10)
        agent.client.call("first_step", job_id=1)
        with open(first, "rb") as f2:  # after the first step: not part of the trace
            f2.seek(1_000_000)
            f2.read(10)
        verdict = agent.release(1)["trace"]
        m = load_manifest(store, image_id, keys=KEYS)
        raw = KEYS.open(
            IMAGE_TRACE, trace_key(image_id, "root"), store.read_bytes(trace_key(image_id, "root"))
        )
        t = Trace.from_json(raw, image_id, m.nblocks, m.block_size)
        # First-access order; kernel readahead may add neighbours of what was read.
        assert verdict == f"saved ({len(t.blocks)} blocks) for root"
        assert t.blocks[0] == 3 and 0 in t.blocks and 1_000_000 // 65536 not in t.blocks
    shutil.rmtree(base / "t1" / "cache")  # a fresh node
    with running_agent(base) as agent:
        again = agent.prepare(2, "test:1")
        p = again["prefetch"]
        assert (p["hot_blocks"], p["fetched_blocks"], p["complete"]) == (len(t.blocks),) * 2 + (
            True,
        )
        assert p["hit_ratio"] == 0.0
        with open(again["path"], "rb") as f:
            f.seek(1_000_000)
            assert f.read(10) == original[1_000_000:1_000_010]
        assert agent.release(2)["trace"].startswith("merged (")
        raw = KEYS.open(
            IMAGE_TRACE, trace_key(image_id, "root"), store.read_bytes(trace_key(image_id, "root"))
        )
        merged = Trace.from_json(raw, image_id, m.nblocks, m.block_size)
        assert merged.blocks[: len(t.blocks)] == t.blocks and 1_000_000 // 65536 in merged.blocks
        assert agent.prepare(3, "test:1")["trace_runs"] == 2
        agent.release(3)


def test_trace_naming_blocks_outside_the_image_is_refused(base: Path, image: Path) -> None:
    image_id = add_image(base, image, "test:1")
    store = open_store(f"file://{base}/store")
    m = load_manifest(store, image_id, keys=KEYS)
    bad = Trace(image_id, m.nblocks, m.block_size, (0, m.nblocks + 5))  # checksum is valid
    save_trace(store, bad, keys=KEYS, user="root")  # sealed: the agent's own checks must refuse it
    with running_agent(base) as agent:
        answer = agent.prepare(1, "test:1")
        assert answer["trace_runs"] == 0 and answer["prefetch"]["hot_blocks"] == 0
        assert "outside the image" in agent.log_text()
        assert Path(answer["path"]).read_bytes() == image.read_bytes()
        agent.release(1)


def test_the_image_mount_reads_ahead_8_mib(base: Path, image: Path) -> None:
    """The kernel keeps several 1 MiB requests in flight for a sequential reader (its
    read-ahead), which the agent's reader threads serve at once: at 1 MiB, one request
    at a time, a first read of an image ran at a fifth of the local disk's speed."""
    add_image(base, image, "test:1")
    with running_agent(base) as agent:
        agent.prepare(1, "test:1")
        dev = mounts.mount_device(agent.mount)
        assert dev is not None
        ra = Path(f"/sys/class/bdi/{dev}/read_ahead_kb")
        wait_until(lambda: ra.read_text().strip() == "8192", "read-ahead 8192 KiB", timeout=HANG)
        agent.release(1)


def test_squashfuse_mounts_the_lazy_image(base: Path, image: Path) -> None:
    add_image(base, image, "test:1")
    mnt = base / "sq"
    mnt.mkdir()
    with running_agent(base) as agent:
        lazy = agent.prepare(1, "test:1")["path"]
        subprocess.run(["squashfuse", lazy, str(mnt)], check=True)
        try:
            src = base / "img.sqsh.src"
            for name in FILES:
                assert (mnt / name).read_bytes() == (src / name).read_bytes()
        finally:
            subprocess.run(["fusermount3", "-u", str(mnt)], check=False)
        agent.release(1)


def test_a_second_squashfuse_mount_rereads_without_asking_the_agent(
    base: Path, image: Path
) -> None:
    """A container started again in the same job (squashfuse mounted anew on the job's
    file, as realsize's ``image_reread`` does) reads the pages the first start left in
    the job file's page cache: no read reaches the agent (``keep_cache`` on open, the
    file's attributes unchanged). The agent's own copy of those bytes (its packs' pages)
    was dropped as it served them: the node holds them once."""
    from tests.imagekit import resident_bytes

    add_image(base, image, "test:1")
    mnt = base / "sq"
    mnt.mkdir()
    src = base / "img.sqsh.src"

    def start(lazy: str) -> None:
        subprocess.run(["squashfuse", lazy, str(mnt)], check=True)
        try:
            for name in FILES:
                assert (mnt / name).read_bytes() == (src / name).read_bytes()
        finally:
            subprocess.run(["fusermount3", "-u", str(mnt)], check=False)

    with running_agent(base) as agent:
        lazy = agent.prepare(1, "test:1")["path"]
        start(lazy)
        first = agent.stats()
        assert first["read_requests"] > 0 and first["read_bytes"] > 0
        packs = sorted((agent.cache / "packs").glob("*.pack"))
        assert packs
        assert sum(resident_bytes(p) for p in packs) == 0
        # The kernel may drop pages under memory pressure (then they are asked again):
        # the claim is about pages it still holds, so it is checked when it holds them all.
        for _ in range(3):
            if resident_bytes(Path(lazy)) >= os.stat(lazy).st_size:
                break
            Path(lazy).read_bytes()
        else:
            pytest.skip("the page cache would not hold the 2.5 MB image (memory pressure)")
        held = agent.stats()["read_requests"]
        start(lazy)
        assert agent.stats()["read_requests"] == held
        agent.release(1)


def test_an_agent_killed_with_sigkill_comes_back(base: Path, image: Path) -> None:
    """kill -9 leaves the dead agent's FUSE mount ("Transport endpoint is not connected");
    the next agent clears it itself (before, it exited with FileExistsError)."""
    from bootseer import mounts
    from tests.imagekit import AgentProc, site_config

    add_image(base, image, "test:1")
    original = image.read_bytes()
    agent = AgentProc(base, "t1", site_config(base))
    try:
        agent.start()
        assert Path(agent.prepare(1, "test:1")["path"]).read_bytes() == original
        agent.kill()
        assert mounts.is_mounted(agent.mount)  # stale: the kernel still lists it
        with pytest.raises(OSError) as stale:
            os.listdir(agent.mount)
        assert stale.value.errno == errno.ENOTCONN
        agent.start()  # a new agent on the same config (systemd's Restart=on-failure)
        assert Path(agent.prepare(2, "test:1")["path"]).read_bytes() == original
        agent.release(2)
    finally:
        agent.stop()


def test_a_block_damaged_in_the_cache_is_never_served(base: Path, image: Path) -> None:
    """Bytes flipped in a cached block (in its pack) while the agent runs: the next job's read
    gets the right bytes (the block is dropped and fetched again), never the damage."""
    add_image(base, image, "test:1")
    original = image.read_bytes()
    with running_agent(base) as agent:
        assert Path(agent.prepare(1, "test:1")["path"]).read_bytes() == original
        held = sorted(blocks_on_disk(agent.cache).values(), key=lambda w: (w.path, w.offset))
        assert held
        for w in held[:3]:
            with open(w.path, "r+b") as fh:  # in place, as a bad disk or a stray write would
                fh.seek(w.offset + w.size // 2)
                byte = fh.read(1)
                fh.seek(-1, os.SEEK_CUR)
                fh.write(bytes([byte[0] ^ 0xFF]))
        # A new job's file: its reads reach the agent (the first file's pages are cached).
        assert Path(agent.prepare(2, "test:1")["path"]).read_bytes() == original
        assert agent.log_text().count("damaged on disk") == 3
        agent.release(1)
        agent.release(2)


def test_the_agent_loads_pyarrow_without_numpy(base: Path, image: Path) -> None:
    # pyarrow imports NumPy wherever it is installed; no agent work uses it (issue 20).
    from tests.importtime import imported

    add_image(base, image, "test:1")
    agent = AgentProc(base, "t1", site_config(base))
    agent.env["PYTHONPROFILEIMPORTTIME"] = "1"  # on the agent's stderr
    try:
        agent.start()
        agent.prepare(1, "test:1")
        agent.release(1)
    finally:
        agent.stop()
    mods = imported((base / "t1-agent.err").read_text())
    assert "pyarrow.fs" in mods and "numpy" not in mods
