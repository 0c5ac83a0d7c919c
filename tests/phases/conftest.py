from __future__ import annotations

import pytest

from bootseer.phases.reader import PhaseDataset
from bootseer.phases.schema import JobMeta, PhaseRow
from bootseer.store import Store

T0 = 1_790_000_000.0  # 2026-09-21, a fixed allocation time


@pytest.fixture
def warnings_seen() -> list[str]:
    return []


@pytest.fixture
def dataset(store: Store, warnings_seen: list[str]) -> PhaseDataset:
    return PhaseDataset(store, on_skip=warnings_seen.append)


def node_rows(
    job_id: int,
    node: str,
    nodes: int = 4,
    slow: float = 0.0,
    restart: int = 0,
    name: str = "train",
    t0: float = T0,
    script: str = "/home/ada/train.sh",
) -> list[PhaseRow]:
    """A plausible startup on one node: prolog with an image step, then the job's phases."""
    m = JobMeta(job_id, restart, name, "ada", "ml", node, nodes, 8, t0 - 30, script=script)
    return [
        m.row("prolog", t0, t0 + 2),
        m.row("image_prefetch", t0 + 0.1, t0 + 1.9, bytes=1 << 20),
        m.row("container_start", t0 + 2, t0 + 3),
        m.row("ckpt_load", t0 + 3, t0 + 8 + slow),
        m.row("framework_init", t0 + 8 + slow, t0 + 9 + slow),
        m.row("first_step", t0 + 9 + slow, t0 + 12 + 4.0),
        m.row("epilog", t0 + 100, t0 + 101),
    ]
