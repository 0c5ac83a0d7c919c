"""Metrics and config problems on a real slurm-dev cluster: the node agents and the
hooks write their textfiles (slurm-dev sets ``[metrics] textfile_dir``) and the values
move as jobs of an ordinary user run; a broken site config line shows in the report."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import DevSlurm, squash

pytestmark = pytest.mark.slurm

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def s(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted(labels.items()))


def read_prom(path: Path) -> Samples:
    if not path.exists():
        return {}
    out: Samples = {}
    for fam in text_string_to_metric_families(path.read_text()):
        for x in fam.samples:
            out[(x.name, tuple(sorted(x.labels.items())))] = x.value
    return out


def metrics_dir(cluster: DevSlurm, node: str) -> Path:
    return cluster.dir / "nodes" / node / "metrics"


def wait_for(path: Path, check: Callable[[Samples], bool], timeout: float = 30) -> Samples:
    deadline = time.monotonic() + timeout
    last: Samples = {}
    while time.monotonic() < deadline:
        last = read_prom(path)
        if last and check(last):
            return last
        time.sleep(0.2)
    raise AssertionError(f"{path} never satisfied the check: {last}")


@pytest.fixture
def image(cluster: DevSlurm) -> Path:
    src = cluster.dir / "metrics-image-src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir()
    (src / "blob").write_bytes(bytes(range(256)) * 6000)
    out = cluster.dir / "images" / "metrics.sqsh"
    out.parent.mkdir(exist_ok=True)
    out.unlink(missing_ok=True)
    return squash(src, out)


READ_IMAGE = "#!/bin/sh\nsrun sh -c 'cat \"$BOOTSEER_IMAGE\" > /dev/null && echo read-ok'\n"


def test_agent_and_hooks_write_metrics_that_move_as_a_job_runs(
    cluster: DevSlurm, image: Path
) -> None:
    node = "n3"
    hooks = metrics_dir(cluster, node) / "bootseer_hooks.prom"
    agent = metrics_dir(cluster, node) / "bootseer_agent.prom"
    before_hooks, before_agent = read_prom(hooks), wait_for(agent, lambda m: True)
    assert before_agent[s("bootseer_agent_up")] == 1

    def count(m: Samples, *key: object) -> float:
        name, labels = key[0], key[1] if len(key) > 1 else {}
        return m.get(s(str(name), **labels), 0.0)  # type: ignore[arg-type]

    job = cluster.sbatch("-N1", "-w", node, f"--bootseer-image={image}", script=READ_IMAGE)
    assert cluster.wait(job, timeout=120) == "COMPLETED", cluster.output(job)
    assert "read-ok" in cluster.output(job)

    after = read_prom(hooks)  # the epilog wrote it before Slurm saw the job end
    for hook in ("prolog", "epilog"):
        key = ("bootseer_hook_runs_total", {"hook": hook, "outcome": "ok"})
        assert count(after, *key) == count(before_hooks, *key) + 1, hook
        key = ("bootseer_hook_seconds_count", {"hook": hook})
        assert count(after, *key) == count(before_hooks, *key) + 1, hook
        assert after[s("bootseer_hook_config_error", hook=hook)] == 0
    prefetch = (
        "bootseer_step_outcomes_total",
        {"hook": "prolog", "step": "image", "outcome": "ok"},
    )
    assert count(after, *prefetch) == count(before_hooks, *prefetch) + 1
    secs = ("bootseer_step_seconds_count", {"hook": "prolog", "step": "image"})
    assert count(after, *secs) == count(before_hooks, *secs) + 1
    assert s("bootseer_phase_source_bytes_total", phase="image_prefetch", source="store") in after
    st = hooks.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o644)

    size = image.stat().st_size
    reads = ("bootseer_image_block_reads_total", {"result": "miss"})
    fetched = ("bootseer_image_fetched_bytes_total", {"priority": "demand"})

    def moved(m: Samples) -> bool:
        return (
            count(m, *reads) > count(before_agent, *reads)
            and count(m, "bootseer_cache_bytes") >= size
            and sum(
                count(m, "bootseer_image_fetched_bytes_total", {"priority": p})
                for p in ("demand", "prefetch", "background")
            )
            >= size
        )

    now = wait_for(agent, moved)
    assert count(now, *fetched) >= count(before_agent, *fetched)
    assert count(now, "bootseer_image_fetch_errors_total") == 0
    assert now[s("bootseer_agent_up")] == 1


def test_a_broken_site_config_line_shows_in_the_report_and_the_metrics(
    cluster: DevSlurm,
) -> None:
    node = "n4"
    hooks = metrics_dir(cluster, node) / "bootseer_hooks.prom"
    before = read_prom(hooks)
    good = cluster.site_config.read_text()
    cluster.configure("hooks", prolog_deadline="soon")  # a bad value: the file will not load
    job = cluster.sbatch(
        "-N1", "-w", node, "--bootseer", script="#!/bin/sh\necho ran-anyway\n", user="alice"
    )
    # The job starts the ordinary way, and the node stays in service.
    assert cluster.wait(job, timeout=120) == "COMPLETED", cluster.output(job)
    assert "ran-anyway" in cluster.output(job)
    assert cluster.node_states()[node].startswith(("idle", "mix", "alloc"))
    # The admin reads the report where the config is good (here: the same file, mended).
    cluster.site_config.write_text(good)

    (run,) = cluster.report_json(job)["runs"]
    (n,) = run["nodes"]
    rows = {p["phase"]: p for p in n["phases"]}
    assert rows["site_config"]["outcome"] == "failed", rows
    assert "hooks.prolog_deadline" in rows["site_config"]["detail"], rows["site_config"]
    assert "soon" in rows["site_config"]["detail"]
    for hook in ("prolog", "epilog"):  # the epilog found it too
        assert rows[hook]["outcome"] == "failed", rows[hook]
        assert "hooks.prolog_deadline" in rows[hook]["detail"], rows[hook]
    text = cluster.report(str(job))
    assert text.returncode == 0, text.stderr
    assert "site_config failed on n4" in text.stdout, text.stdout  # why phases failed
    assert "hooks.prolog_deadline" in text.stdout, text.stdout
    # The node's log says it too, and the metrics count it.
    assert any(
        "config_error" in ln and "hooks.prolog_deadline" in ln
        for ln in cluster.job_log_lines(node, job)
    )
    after = read_prom(hooks)
    for hook in ("prolog", "epilog"):
        key = s("bootseer_hook_runs_total", hook=hook, outcome="config_error")
        assert after[key] == before.get(key, 0.0) + 1, hook
        assert after[s("bootseer_hook_config_error", hook=hook)] == 1


READ_ON_EACH_NODE = (
    "#!/bin/sh\nsrun -N2 -n2 sh -c 'cat \"$BOOTSEER_IMAGE\" > /dev/null && echo read-ok'\n"
)


def test_a_two_node_job_moves_the_peer_series_and_they_outlive_the_job(
    cluster: DevSlurm,
) -> None:
    """Both nodes read the whole image: each block leaves the store once, its owner hands
    it to the other node. The counts stay once the job's swarm has ended."""
    src = cluster.dir / "metrics-p2p-src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir()
    (src / "blob").write_bytes(os.urandom(3 << 20))  # fresh blocks: no cache has them
    image = cluster.dir / "images" / "metrics-p2p.sqsh"
    image.parent.mkdir(exist_ok=True)
    image.unlink(missing_ok=True)
    squash(src, image)
    nodes = ("n1", "n2")
    files = [metrics_dir(cluster, n) / "bootseer_agent.prom" for n in nodes]
    before = [wait_for(f, lambda m: True) for f in files]

    def total(ms: list[Samples], name: str, **labels: str) -> float:
        return sum(m.get(s(name, **labels), 0.0) for m in ms)

    job = cluster.sbatch(
        "-N2", "-w", ",".join(nodes), f"--bootseer-image={image}", script=READ_ON_EACH_NODE
    )
    assert cluster.wait(job, timeout=120) == "COMPLETED", cluster.output(job)
    assert cluster.output(job).count("read-ok") == 2, cluster.output(job)
    # Read after the epilog released the job (and its swarm): the agents write every 2 s.
    ended = time.time()
    after = [
        wait_for(f, lambda m: m[s("bootseer_agent_metrics_timestamp_seconds")] > ended)
        for f in files
    ]
    peer = total(after, "bootseer_p2p_bytes_total", source="peer") - total(
        before, "bootseer_p2p_bytes_total", source="peer"
    )
    store = total(after, "bootseer_p2p_bytes_total", source="store") - total(
        before, "bootseer_p2p_bytes_total", source="store"
    )
    served = total(after, "bootseer_peer_served_bytes_total") - total(
        before, "bootseer_peer_served_bytes_total"
    )
    size = image.stat().st_size
    assert peer > 0 and store > 0, (peer, store)
    # What one node received, the other served (a piece that came too late for a busy
    # asker was served all the same, then fetched from the store).
    assert served >= peer
    assert peer + store >= size  # each node had every block, from the store or its peer
    assert total(after, "bootseer_verification_failures_total", source="peer") == total(
        before, "bootseer_verification_failures_total", source="peer"
    )


SAVE_CKPT = (
    "#!/bin/sh\nset -e\n"
    'head -c 300000 /dev/zero > "$BOOTSEER_CKPT/model.pt"\n'
    'cmp "$BOOTSEER_CKPT/model.pt" /dev/zero 2>&1 | grep -q EOF && echo saved\n'
    # a relative symlink works (issue 23); a hard link is still refused, and counted
    'ln -s model.pt "$BOOTSEER_CKPT/latest"\n'
    'ln "$BOOTSEER_CKPT/model.pt" "$BOOTSEER_CKPT/hard" 2>/dev/null || echo link-refused\n'
)


def test_a_checkpoint_mount_daemon_adds_what_it_moved(cluster: DevSlurm) -> None:
    """The job's mount daemon adds to the node's bootseer_ckpt.prom while it serves and
    at unmount; the counts outlive it."""
    node = "n2"
    ckpt = metrics_dir(cluster, node) / "bootseer_ckpt.prom"
    before = read_prom(ckpt)

    def count(m: Samples, name: str, **labels: str) -> float:
        return m.get(s(name, **labels), 0.0)

    job = cluster.sbatch("-N1", "-w", node, "--bootseer-ckpt=metrics/run", script=SAVE_CKPT)
    assert cluster.wait(job, timeout=120) == "COMPLETED", cluster.output(job)
    assert cluster.output(job).split() == ["saved", "link-refused"], cluster.output(job)
    after = read_prom(ckpt)  # the epilog unmounted: the daemon's last write is in
    grew = {
        name: count(after, name, **labels) - count(before, name, **labels)
        for name, labels in (
            ("bootseer_ckpt_mounts_total", {}),
            ("bootseer_ckpt_written_bytes_total", {}),
            ("bootseer_ckpt_read_bytes_total", {}),
            ("bootseer_ckpt_versions_total", {"result": "committed"}),
            ("bootseer_ckpt_refused_calls_total", {"reason": "not_permitted"}),
        )
    }
    assert grew == {
        "bootseer_ckpt_mounts_total": 1,
        "bootseer_ckpt_written_bytes_total": 300000,
        "bootseer_ckpt_read_bytes_total": grew["bootseer_ckpt_read_bytes_total"],
        "bootseer_ckpt_versions_total": 1,
        "bootseer_ckpt_refused_calls_total": 1,
    }, grew
    assert grew["bootseer_ckpt_read_bytes_total"] >= 300000
    st = ckpt.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o644)
