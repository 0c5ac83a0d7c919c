"""Issue 22's install count: ``bootseer config --init STORE`` makes the site key, the
config and a file:// store's root in one command, overwriting nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer.config import load_config
from bootseer.errors import ConfigError
from bootseer.install.siteinit import init_site
from bootseer.sitekey import read_key_file


def test_init_makes_key_config_and_store_root_and_a_second_run_keeps_them(
    tmp_path: Path,
) -> None:
    etc, share = tmp_path / "etc", tmp_path / "shared"
    share.mkdir()
    config, key = etc / "config.toml", etc / "site.key"
    store = f"file://{share}/bootseer"
    said = init_site(config, store, key)
    assert [s.split(":")[1].split()[0] for s in said] == ["made", "made", "made"], said
    assert key.stat().st_mode & 0o777 == 0o600
    cfg = load_config(config)
    assert cfg.store.uri == store and cfg.site.key_file == key
    if os.geteuid() == 0:  # the key reads as the root-run parts read it
        assert len(read_key_file(key)) == 1
    assert (share / "bootseer").is_dir()
    before = key.read_bytes(), config.read_bytes()
    again = init_site(config, store, key)
    assert "kept" in again[0] and "kept" in again[1] and "is there" in again[2], again
    assert (key.read_bytes(), config.read_bytes()) == before


def test_init_refuses_another_store_and_an_unmounted_share(tmp_path: Path) -> None:
    config, key = tmp_path / "config.toml", tmp_path / "site.key"
    with pytest.raises(ConfigError, match="is the share mounted"):
        init_site(config, f"file://{tmp_path}/not-mounted/bootseer", key)
    assert not (tmp_path / "not-mounted").exists()
    init_site(config, f"file://{tmp_path}/store", key)
    with pytest.raises(ConfigError, match="names the store"):
        init_site(config, f"file://{tmp_path}/other", key)
    with pytest.raises(ConfigError, match="file:///PATH"):
        init_site(tmp_path / "c2.toml", "/shared/bootseer", key)


@pytest.mark.root
def test_config_init_then_check_passes_as_root(tmp_path: Path) -> None:
    (tmp_path / "shared").mkdir()
    env = {**os.environ, "BOOTSEER_CONFIG": str(tmp_path / "etc/config.toml")}
    r = subprocess.run(
        [sys.executable, "-m", "bootseer.cli", "config", "--init", f"file://{tmp_path}/shared/bs"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "site key" in r.stdout and "ok" in r.stdout, r.stdout
