"""A job has its checkpoint's units warmed into the node agent's cache from the mount on
(issue 19, "Two nodes against one"): the job's reads of them are then cache hits, not
the target's (or a peer's) reads after the container has started."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bootseer.ckpt.manifest import Manifest
from bootseer.ckpt.namespace import Namespace
from bootseer.ckpt.warm import Warm, WarmResult, all_of, prolog_done
from bootseer.config import SiteConfig
from bootseer.p2p.via import Via, agent_via
from bootseer.sitekey import SiteKeys
from bootseer.store import open_store
from tests.imagekit import AgentProc, site_config

UNIT = 256 << 10
KEYS = SiteKeys([bytes(range(32))])


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[AgentProc, dict[str, Any], list[str]]]:
    """An agent whose site has three checkpoint targets (file://)."""
    targets = []
    for i in range(3):
        (tmp_path / f"t{i}").mkdir()
        targets.append(f"file://{tmp_path}/t{i}")
    config = site_config(tmp_path)
    config["ckpt"] = {"targets": targets, "unit_size": UNIT}
    a = AgentProc(tmp_path, "t1", config)
    try:
        yield a.start(), config, targets
    finally:
        a.stop()


def _ns(targets: list[str], via: Via | None) -> Namespace:
    ns = Namespace([open_store(u) for u in targets], "alice/run", unit_size=UNIT, keys=KEYS)
    ns.via = via
    return ns


def _saved(tmp_path: Path, units: int) -> list[str]:
    """Three file:// targets holding a checkpoint ``a.pt`` of ``units`` units."""
    targets = []
    for i in range(3):
        (tmp_path / f"t{i}").mkdir()
        targets.append(f"file://{tmp_path}/t{i}")
    with _ns(targets, None).open("a.pt", "wb") as f:
        f.write(os.urandom(units * UNIT))
    return targets


def _sources(via: Via, log: list[tuple[str, str]]) -> Via:
    """``via``, noting where each unit came from (store, peer, cache)."""

    def counted(
        target: str, key: str, offset: int, length: int, digest: str
    ) -> tuple[bytes | memoryview, str] | None:
        got = via(target, key, offset, length, digest)
        log.append((key, got[1] if got else "none"))
        return got

    return counted


def test_warmed_units_are_cache_hits_for_the_jobs_reads(
    agent: tuple[AgentProc, dict[str, Any], list[str]],
) -> None:
    _, config, targets = agent
    data = {f"shard{i}.pt": os.urandom(5 * UNIT + 1000) for i in range(2)}
    writer = _ns(targets, None)
    for name, body in data.items():
        with writer.open(name, "wb") as f:
            f.write(body)
    cfg = SiteConfig.from_mapping(config).for_node("t1")
    # A two-node job (both names this node's: the agent owns every unit and reads the
    # targets for it, as the owner among real peers does).
    via = agent_via(cfg, 7, ("t1", "t1"), log=print, owner=(0, ""))
    assert via is not None

    warm = Warm(_ns(targets, via), limit=1 << 30)
    res = warm.run()
    assert (res.units, res.stopped_by) == (12, "")  # 6 units a file, every one
    assert res.store_bytes == sum(len(b) for b in data.values())

    asked: list[tuple[str, str]] = []
    reader = _ns(targets, _sources(via, asked))
    for name, body in data.items():
        with reader.open(name) as f:
            assert f.read() == body
    assert asked and {src for _, src in asked} == {"cache"}  # nothing from the targets
    assert reader.store_bytes == 0


def test_a_one_node_job_warms_through_the_agent_when_asked(
    agent: tuple[AgentProc, dict[str, Any], list[str]],
) -> None:
    """A one-node job's checkpoint goes through the agent when its daemon warms (the
    agent reads the targets itself, no peer named): its reads are then cache hits. The
    link idled 1.5 s of a one-node start before the checkpoint's first read."""
    _, config, targets = agent
    body = os.urandom(4 * UNIT + 7)
    writer = _ns(targets, None)
    with writer.open("model.pt", "wb") as f:
        f.write(body)
    cfg = SiteConfig.from_mapping(config).for_node("t1")
    assert agent_via(cfg, 9, ("t1",), log=print, owner=(0, "")) is None  # nothing to share
    via = agent_via(cfg, 9, ("t1",), log=print, owner=(0, ""), one_node=True)
    assert via is not None

    res = Warm(_ns(targets, via), limit=1 << 30).run()
    assert (res.units, res.store_bytes, res.peer_bytes, res.stopped_by) == (5, len(body), 0, "")
    asked: list[tuple[str, str]] = []
    reader = _ns(targets, _sources(via, asked))
    with reader.open("model.pt") as f:
        assert f.read() == body
    assert {src for _, src in asked} == {"cache"}
    assert reader.store_bytes == 0


def test_the_warm_up_stops_at_its_limit_and_without_the_agent(
    agent: tuple[AgentProc, dict[str, Any], list[str]],
) -> None:
    _, config, targets = agent
    writer = _ns(targets, None)
    with writer.open("big.pt", "wb") as f:
        f.write(os.urandom(8 * UNIT))
    cfg = SiteConfig.from_mapping(config).for_node("t1")
    via = agent_via(cfg, 8, ("t1", "t1"), log=print, owner=(0, ""))
    res = Warm(_ns(targets, via), limit=3 * UNIT).run()
    assert (res.units, res.bytes, res.stopped_by) == (3, 3 * UNIT, "limit")
    # Without the agent's path (p2p off): nothing to warm into.
    idle = Warm(_ns(targets, None), limit=1 << 30)
    idle.start()
    assert idle._thread is None  # not even started: the reads will go to the targets
    idle.stop()
    assert idle.result == WarmResult()


def test_the_warm_up_waits_until_the_image_is_settled(tmp_path: Path) -> None:
    """No unit is asked while ``settled`` says the image's hot set is still coming (the
    container's start needs it first); then every unit is, in order."""
    targets = _saved(tmp_path, 3)
    events: list[str] = []

    def via(
        target: str, key: str, offset: int, length: int, digest: str
    ) -> tuple[bytes | memoryview, str] | None:
        events.append("unit")
        return b"x" * length, "peer"

    answers = iter([False, False, True])

    def settled(waited: float) -> bool:
        events.append("asked")
        return next(answers)

    res = Warm(_ns(targets, via), limit=1 << 30, settled=settled, parallel=1).run()
    assert events == ["asked", "asked", "asked", "unit", "unit", "unit"]
    assert (res.units, res.peer_bytes) == (3, 3 * UNIT)


def test_the_newest_files_are_warmed_first(tmp_path: Path) -> None:
    """A namespace keeps earlier checkpoints beside the one a restart loads: the files
    committed last are warmed first, so the limit goes to them, not to the oldest
    (which come first by name here). The order comes from the listings' mtimes: no
    manifest is read but the warmed file's."""
    targets = []
    for i in range(3):
        (tmp_path / f"t{i}").mkdir()
        targets.append(f"file://{tmp_path}/t{i}")
    writer = _ns(targets, None)
    for age, name in ((300, "step_1/model.pt"), (100, "step_3/model.pt"), (200, "step_2/model.pt")):
        writer.mkdir(name.split("/")[0])
        with writer.open(name, "wb") as f:
            f.write(os.urandom(2 * UNIT))
        # Committed `age` seconds ago: the manifest's file on the first target (file://).
        then = time.time() - age
        os.utime(tmp_path / "t0" / writer.manifest_key(name), (then, then))
    asked: list[str] = []

    def via(
        target: str, key: str, offset: int, length: int, digest: str
    ) -> tuple[bytes | memoryview, str] | None:
        asked.append(key)
        return b"x" * length, "peer"

    ns = _ns(targets, via)
    newest = ns.manifest("step_3/model.pt")
    assert newest is not None
    read: list[str] = []
    manifest = ns.manifest

    def noted(path: str) -> Manifest | None:
        read.append(path)
        return manifest(path)

    ns.manifest = noted  # type: ignore[method-assign]
    res = Warm(ns, limit=2 * UNIT, parallel=1).run()
    assert (res.units, res.stopped_by) == (2, "limit")
    assert asked == [ns.unit_key(newest.version, unit) for unit, _ in newest.units]
    assert read[0] == "step_3/model.pt" and "step_1/model.pt" not in read


def test_the_warm_up_waits_for_the_prologs_end_too(tmp_path: Path) -> None:
    """With the image settled, no unit is asked until the prolog has written the job's
    env file (its last act, after the restore): beside the restore, the warm-up cost a
    real-size start 4 s (docs/performance.md, "The warm-up beside the restore")."""
    targets = _saved(tmp_path, 2)
    env = tmp_path / "jobs" / "7" / "env"
    events: list[str] = []

    def via(
        target: str, key: str, offset: int, length: int, digest: str
    ) -> tuple[bytes | memoryview, str] | None:
        events.append(f"unit, env {'written' if env.exists() else 'missing'}")
        return b"x" * length, "peer"

    def image(waited: float) -> bool:
        events.append("image asked")
        return events.count("image asked") > 1

    def prolog(waited: float) -> bool:
        events.append("prolog asked")
        if events.count("prolog asked") == 3:  # the prolog ends now
            env.parent.mkdir(parents=True)
            env.write_text("#bootseer-env 2\n")
        return prolog_done(env)(waited)

    res = Warm(_ns(targets, via), limit=1 << 30, settled=all_of(image, prolog), parallel=1).run()
    assert events == [
        "image asked",
        "prolog asked",
        "image asked",  # settled now: asked no more
        "prolog asked",
        "prolog asked",
        "unit, env written",
        "unit, env written",
    ]
    assert res.units == 2
