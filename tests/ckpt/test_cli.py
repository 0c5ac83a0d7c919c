"""``bootseer ckpt``: put, ls, get, verify, rm, gc against file:// targets."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from bootseer.cli import main
from bootseer.units import iec

from .conftest import UNIT

pytestmark = pytest.mark.root


def test_put_ls_get_verify_rm(
    site_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "model.pt"
    src.write_bytes(os.urandom(3 * UNIT + 5))
    assert main(["ckpt", "put", str(src), "run:step1/model.pt"]) == 0
    assert main(["ckpt", "ls", "run:step1"]) == 0
    out = capsys.readouterr().out
    (row,) = [line.split() for line in out.splitlines() if "model.pt" in line]
    assert row[:2] == iec(3 * UNIT + 5).split() and row[-2:] == ["4", "model.pt"], out
    dst = tmp_path / "back.pt"
    assert main(["ckpt", "get", "run:step1/model.pt", str(dst)]) == 0
    assert dst.read_bytes() == src.read_bytes()
    assert main(["ckpt", "verify", "run"]) == 0
    assert "1 files" in capsys.readouterr().out
    assert main(["ckpt", "rm", "run:step1/model.pt"]) == 0
    assert main(["ckpt", "get", "run:step1/model.pt", str(dst)]) == 1
    assert "no checkpoint file" in capsys.readouterr().err


def test_verify_reports_a_corrupt_unit(
    site_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "m"
    src.write_bytes(os.urandom(2 * UNIT))
    assert main(["ckpt", "put", str(src), "run:m"]) == 0
    me = pwd.getpwuid(os.getuid()).pw_name
    units = sorted((tmp_path / "t1" / me / "run" / "units").glob("*/1"))
    assert len(units) == 1
    units[0].write_bytes(b"x" * UNIT)
    assert main(["ckpt", "verify", "run:m"]) == 1
    assert "unit 1" in capsys.readouterr().err


def test_bad_names_are_refused(site_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ckpt", "ls", "../other"]) == 1
    assert main(["ckpt", "get", "run:../../etc/passwd", "/tmp/x"]) == 1
    assert "invalid" in capsys.readouterr().err


def test_ls_of_what_does_not_exist_is_an_error(
    site_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ckpt ls NOSUCH`` printed nothing and exited 0, like an empty directory."""
    assert main(["ckpt", "ls", "NOSUCH"]) == 1
    assert "NOSUCH: no such checkpoint namespace" in capsys.readouterr().err
    src = tmp_path / "m"
    src.write_bytes(b"x" * 10)
    assert main(["ckpt", "put", str(src), "run:a/m"]) == 0
    capsys.readouterr()
    assert main(["ckpt", "ls", "run:a/nosuch"]) == 1
    assert "run:a/nosuch: no such checkpoint file or directory" in capsys.readouterr().err
    assert main(["ckpt", "ls", "run:a/m"]) == 0  # a file lists itself
    assert capsys.readouterr().out.splitlines()[-1].split()[-1] == "m"
    assert main(["ckpt", "ls", "run"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].split() == ["dir", "a/"]


@pytest.mark.skipif(os.geteuid() != 0, reason="root's ckpt get, and a file of mallory's")
def test_roots_get_into_a_shared_directory_writes_through_no_planted_link(
    site_config: Path, tmp_path: Path
) -> None:
    """An admin's `bootseer ckpt get ns:path /tmp/model.pt`, as the examples show: root
    opened /tmp/model.pt.part as it was, and mallory's link there made it write the
    checkpoint into any file (here one standing for /etc/shadow). Now the partial file
    is a new one of its own, and the link and its target are left alone."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)  # as /tmp, where this machine does not protect links
    victim = tmp_path / "shadow"
    victim.write_text("root:secret\n")
    planted = shared / "model.pt.part"
    planted.symlink_to(victim)
    mallory = pwd.getpwnam("mallory") if "mallory" in {p.pw_name for p in pwd.getpwall()} else None
    if mallory is not None:
        os.lchown(planted, mallory.pw_uid, mallory.pw_gid)
    src = tmp_path / "model.pt"
    src.write_bytes(os.urandom(2 * UNIT + 3))
    assert main(["ckpt", "put", str(src), "run:model.pt"]) == 0
    dst = shared / "model.pt"
    assert main(["ckpt", "get", "run:model.pt", str(dst)]) == 0
    assert dst.read_bytes() == src.read_bytes() and not dst.is_symlink()
    assert victim.read_text() == "root:secret\n"
    assert planted.is_symlink()
    assert sorted(p.name for p in shared.iterdir()) == ["model.pt", "model.pt.part"]


def test_a_site_without_checkpoint_targets_shows_no_quota(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ckpt usage`` showed a 16 TiB quota on a site with no checkpoint storage."""
    path = tmp_path / "config.toml"
    path.write_text(f'[paths]\ncache_dir = "{tmp_path}/cache"\n')
    monkeypatch.setenv("BOOTSEER_CONFIG", str(path))
    for action in (["usage"], ["ls", "run"]):
        assert main(["ckpt", *action]) == 1
        out = capsys.readouterr()
        assert "TiB" not in out.out + out.err
        assert f"no checkpoint storage ([ckpt] targets is empty in {path})" in out.err
