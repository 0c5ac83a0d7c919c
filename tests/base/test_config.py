from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bootseer.config import SiteConfig, load_config
from bootseer.errors import ConfigError, NoSiteConfig


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "config.toml"
    p.write_text(text)
    return p


def test_missing_default_file_gives_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("BOOTSEER_CONFIG", raising=False)
    monkeypatch.setattr("bootseer.config.DEFAULT_PATH", tmp_path / "absent.toml")
    assert load_config() == SiteConfig()


def test_env_var_names_the_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    p = write(tmp_path, '[store]\nuri = "file:///shared/bs"\n[hooks]\nstrict = true\n')
    monkeypatch.setenv("BOOTSEER_CONFIG", str(p))
    cfg = load_config()
    assert cfg.store.uri == "file:///shared/bs"
    assert cfg.hooks.strict is True
    assert cfg.source == p


def test_missing_file_named_by_env_is_an_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("BOOTSEER_CONFIG", str(tmp_path / "nope.toml"))
    with pytest.raises(NoSiteConfig, match="does not exist"):  # a ConfigError of its own kind
        load_config()
    with pytest.raises(NoSiteConfig):  # named by the caller
        load_config(tmp_path / "absent.toml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[hooks]\nstrict = 1\n", "hooks.strict must be true or false"),
        ("[hooks]\nprolog_deadline = 'soon'\n", "hooks.prolog_deadline must be a number"),
        ("[hooks]\nprolog_deadline = -1\n", "hooks.prolog_deadline must not be negative"),
        ("[paths]\nrun_dir = 'relative'\n", "paths.run_dir must be an absolute path"),
        ("[ckpt]\nmount_root = 'x/%n'\n", "ckpt.mount_root must be an absolute path"),
        ("[hooks]\nstrikt = true\n", "unknown key hooks.strikt"),
        ("[stroe]\nuri = 'x'\n", "unknown key stroe"),
        ("hooks = 3\n", r"\[hooks\] must be a table"),
        ("[hooks]\nfailpoints = 'image:raise'\n", "hooks.failpoints must be a list"),
        ("[hooks\n", "not valid TOML"),
        ("[image]\nroot_path_trace_owner = 'a b'\n", "image.root_path_trace_owner: 'a b'"),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text))


def test_node_paths_replace_percent_n() -> None:
    cfg = SiteConfig.from_mapping({"paths": {"run_dir": "/var/tmp/dev/nodes/%n/run"}})
    assert cfg.for_node("n3").paths.run_dir == Path("/var/tmp/dev/nodes/n3/run")


def test_step_deadline_never_exceeds_the_hook_deadline() -> None:
    cfg = SiteConfig.from_mapping(
        {"hooks": {"prolog_deadline": 30, "step_deadlines": {"image": 10, "deps": 99}}}
    )
    assert cfg.deadline("prolog", "image") == 10
    assert cfg.deadline("prolog", "deps") == 30
    assert cfg.deadline("prolog", "ckpt") == 30


def test_checking_the_config_loads_no_technique(tmp_path: Path) -> None:
    """The site config is a base module: checking every section (a trace owner's user
    name included) imports no technique package (the image code, once)."""
    p = write(tmp_path, "[image]\nroot_path_trace_owner = 'alice'\n")
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from bootseer.config import load_config\n"
        "assert load_config(Path(sys.argv[1])).image.root_path_trace_owner == 'alice'\n"
        "above = ('image', 'deps', 'ckpt', 'p2p', 'phases', 'metrics', 'agent', 'hooks', 'cli')\n"
        "print(sorted(m for m in sys.modules if m.partition('.')[2].split('.')[0] in above\n"
        "             and m.startswith('bootseer.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(p)], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_a_retired_key_is_read_as_if_it_were_not_set(tmp_path: Path) -> None:
    """An upgrade never breaks a node's hooks over a setting that went away: a config
    that still sets `[ckpt] mount_timeout` (retired: the ckpt step's deadline bounds the
    mount) loads, with its other keys; a misspelt key is still refused, by name."""
    path = tmp_path / "config.toml"
    path.write_text("[ckpt]\nmount_timeout = 20.0\nunit_size = 1048576\n")
    cfg = load_config(path)
    assert cfg.ckpt.unit_size == 1 << 20 and not hasattr(cfg.ckpt, "mount_timeout")
    with pytest.raises(ConfigError, match=r"unknown key ckpt\.mount_timeou "):
        SiteConfig.from_mapping({"ckpt": {"mount_timeou": 20.0}})


def test_the_prolog_waits_for_the_mount_as_long_as_its_step_may() -> None:
    """A loaded node's mount took 27-30 s to come up: the prolog waits until the ckpt
    step's own deadline (less a second to clean up), not a separate 20 s."""
    from bootseer.ckpt.step import mount_wait

    assert mount_wait(90.0) == 89.0
    assert mount_wait(0.5) == 1.0  # never less than a second's try
