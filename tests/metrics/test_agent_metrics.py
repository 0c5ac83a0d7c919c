"""A real node agent (FUSE, a squashfs image, its store) writes bootseer_agent.prom:
on start, every interval, and at its exit with bootseer_agent_up 0."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bootseer.agentapi.errors import AgentError
from bootseer.image.manifest import upload_file
from bootseer.image.registry import tag_image
from bootseer.store import open_store
from tests.imagekit import AgentProc, add_image, make_squashfs, site_config

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("mksquashfs") or not os.path.exists("/dev/fuse"),
        reason="needs root, /dev/fuse and squashfs-tools",
    ),
]


def read_prom(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(path.read_text()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def wait_for(
    path: Path,
    check: Callable[[dict[tuple[str, tuple[tuple[str, str], ...]], float]], bool],
    timeout: float = 30,
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The file's samples once ``check`` holds for them (the agent rewrites it)."""
    deadline = time.monotonic() + timeout
    last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    while time.monotonic() < deadline:
        if path.exists():
            last = read_prom(path)
            if check(last):
                return last
        time.sleep(0.1)
    raise AssertionError(f"{path} never satisfied the check: {last}")


def s(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted(labels.items()))


def test_agent_writes_its_metrics_and_they_move_with_reads(base: Path) -> None:
    image = make_squashfs(base / "img.sqsh", {"a": 900_000, "b": 400_000})
    add_image(base, image, "test:1")
    config = site_config(base, "t1")
    config["metrics"] = {"textfile_dir": f"{base}/metrics/%n", "interval": 1}
    agent = AgentProc(base, "t1", config)
    prom = base / "metrics" / "t1" / "bootseer_agent.prom"
    try:
        agent.start()
        first = wait_for(prom, lambda m: m.get(s("bootseer_agent_up")) == 1)
        assert first[s("bootseer_cache_bytes")] == 0
        assert first[s("bootseer_cache_capacity_bytes")] > 0
        st = prom.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (0, 0o644)

        lazy = Path(agent.prepare(1, "test:1")["path"])
        assert lazy.read_bytes() == image.read_bytes()  # every block: a miss, then fetched
        assert lazy.read_bytes() == image.read_bytes()  # the same blocks: hits

        def moved(m: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> bool:
            return (
                m[s("bootseer_image_block_reads_total", result="miss")] > 0
                and m[s("bootseer_image_block_reads_total", result="hit")] > 0
                and m[s("bootseer_cache_bytes")] >= image.stat().st_size
                and m[s("bootseer_agent_jobs")] == 1
            )

        during = wait_for(prom, moved)
        fetched = sum(
            during[s("bootseer_image_fetched_bytes_total", priority=p)]
            for p in ("demand", "prefetch", "background")
        )
        assert fetched >= image.stat().st_size
        assert during[s("bootseer_image_fetch_errors_total")] == 0
        assert during[s("bootseer_verification_failures_total", source="store")] == 0
        later = wait_for(
            prom,
            lambda m: (
                m[s("bootseer_agent_metrics_timestamp_seconds")]
                > during[s("bootseer_agent_metrics_timestamp_seconds")]
            ),
        )
        assert (
            later[s("bootseer_agent_start_time_seconds")]
            == first[s("bootseer_agent_start_time_seconds")]
        )
        agent.release(1)

        # mallory points a name at her own image (unsealed: she has no site key).
        evil = make_squashfs(base / "evil.sqsh", {"a": 300_000}, seed=2)
        store = open_store(f"file://{base}/store")
        tag_image(store, "evil:1", upload_file(store, str(evil), 64 << 10, keys=None), keys=None)
        with pytest.raises(AgentError):
            agent.prepare(2, "evil:1")
        refused = s("bootseer_agent_records_refused_total", purpose="image.name")
        assert wait_for(prom, lambda m: m[refused] >= 1)[refused] == 1
    finally:
        agent.stop()
    doc = (Path(__file__).resolve().parents[2] / "docs" / "admin.md").read_text()
    for fam in text_string_to_metric_families(prom.read_text()):
        name = f"{fam.name}_total" if fam.type == "counter" else fam.name
        assert f"| `{name}` | {fam.type} |" in doc, name
    final = read_prom(prom)  # written at exit, after the last interval's
    assert final[s("bootseer_agent_up")] == 0
    assert final[s("bootseer_image_block_reads_total", result="hit")] > 0


def test_an_unwritable_metrics_dir_costs_a_log_line_not_the_agent(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    (tmp_path / "not-a-dir").write_text("")
    config = site_config(tmp_path, "t1")
    config["metrics"] = {"textfile_dir": f"{tmp_path}/not-a-dir/metrics", "interval": 1}
    agent = AgentProc(tmp_path, "t1", config)
    try:
        agent.start()  # answers on its socket
        assert agent.stats()["node"] == "t1"
        assert "metrics not written" in agent.log_text()
    finally:
        agent.stop()


def test_a_user_over_the_socket_cap_shows_in_the_refused_count(base: Path) -> None:
    from tests.agent.test_socket import MALLORY, as_user, busy_answers, hold

    # mallory reaches the socket: conftest's base, never under pytest's tmp_path
    config = site_config(base, "t1", max_connections=6, max_connections_per_user=4)
    config["metrics"] = {"textfile_dir": f"{base}/metrics", "interval": 1}
    agent = AgentProc(base, "t1", config)
    prom = base / "metrics" / "bootseer_agent.prom"
    mallory = None
    try:
        agent.start()
        mallory = as_user(MALLORY, hold(agent.socket, 20))
        assert busy_answers(agent, mallory) == 16
        got = wait_for(prom, lambda m: m[s("bootseer_agent_socket_refused_total")] == 16)
        assert got[s("bootseer_agent_socket_connections")] >= 4
    finally:
        if mallory is not None:
            mallory.kill()
            mallory.wait()
        agent.stop()
