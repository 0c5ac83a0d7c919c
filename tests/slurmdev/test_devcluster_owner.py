"""Two checkouts on one machine: one's slurm-dev never repoints or stops the other's cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TOP, devcluster


@pytest.mark.parametrize("action", ["up", "down"])
def test_another_checkouts_cluster_is_refused(tmp_path: Path, action: str) -> None:
    other = tmp_path / "other-clone"
    other.mkdir()
    state = tmp_path / "dev"
    state.mkdir()
    (state / "checkout").write_text(f"{other}\n")
    with pytest.raises(SystemExit, match="is the cluster of another checkout") as exc:
        devcluster.main([action, "--state-dir", str(state)])
    assert str(other) in str(exc.value) and str(TOP) in str(exc.value)
    assert sorted(p.name for p in state.iterdir()) == ["checkout"]


def test_a_gone_owner_or_this_checkout_is_not_in_the_way(tmp_path: Path) -> None:
    state = tmp_path / "dev"
    state.mkdir()
    (state / "checkout").write_text(f"{tmp_path / 'gone'}\n")
    devcluster.refuse_another_checkouts(state)
    (state / "checkout").write_text(f"{TOP}\n")
    devcluster.refuse_another_checkouts(state)


def test_a_stopped_cluster_is_nobodys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After this checkout's `down`, another clone may start its cluster on the state dir."""
    monkeypatch.setattr("os.geteuid", lambda: 0)
    state = tmp_path / "dev"
    state.mkdir()
    (state / "checkout").write_text(f"{TOP}\n")
    assert devcluster.main(["down", "--state-dir", str(state)]) == 0
    assert not (state / "checkout").exists()
