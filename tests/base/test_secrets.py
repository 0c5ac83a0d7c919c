"""Store secrets and confidentiality on file:// stores (docs/security.md, "Store secrets"
and "Confidentiality behind file:// stores").

Credentials live in a root-only secrets file apart from the site config users read; only
root loads them. On a file:// store, what root-run parts write is root's alone (0600 in
0700 directories) but phase records, which `bootseer report` reads as users."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer.config import load_config
from bootseer.credentials import read_secrets_file, store_credentials
from bootseer.errors import ConfigError
from bootseer.store import open_store

pytestmark = pytest.mark.root

USER = 4242  # any uid but root's (no account needed)
SECRET = "s3cr3t-never-printed"
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (files owned by root)")


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user can enter (pytest's tmp_path is root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="bootseer-secrets-", dir="/var/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d)


def as_user(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--clear-groups", *cmd],
        capture_output=True,
        text=True,
        timeout=60,
    )


def write_site(d: Path, secrets_mode: int = 0o600) -> Path:
    config = d / "config.toml"
    (d / "store").mkdir(mode=0o755, exist_ok=True)
    key = d / "site.key"
    key.write_text(os.urandom(32).hex() + "\n")
    key.chmod(0o600)
    config.write_text(f'[site]\nkey_file = "{key}"\n[store]\nuri = "file://{d}/store"\n')
    config.chmod(0o644)
    secrets = d / "secrets.toml"
    secrets.write_text(f'[store]\naccess_key = "admin"\nsecret_key = "{SECRET}"\n')
    secrets.chmod(secrets_mode)
    return config


def test_a_site_config_holding_store_keys_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'[store]\nuri = "s3://b/p"\naccess_key = "admin"\nsecret_key = "{SECRET}"\n')
    with pytest.raises(ConfigError, match="secrets file"):
        load_config(config)


@root_only
def test_root_loads_the_secrets_file_next_to_the_config(shared: Path) -> None:
    cfg = load_config(write_site(shared))
    assert cfg.store.secrets_file == shared / "secrets.toml"
    creds = store_credentials(cfg.store.secrets_file)
    assert (creds.access_key, creds.secret_key) == ("admin", SECRET)
    assert SECRET not in repr(creds)
    # named explicitly
    other = shared / "elsewhere.toml"
    shutil.copy2(shared / "secrets.toml", other)
    (shared / "config.toml").write_text(
        f'[store]\nuri = "file://{shared}/store"\nsecrets_file = "{other}"\n'
    )
    assert load_config(shared / "config.toml").store.secrets_file == other


@root_only
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_secrets_file_others_can_read_is_refused(shared: Path, mode: int) -> None:
    cfg = load_config(write_site(shared, mode))
    with pytest.raises(ConfigError, match="mode 0600"):
        cfg.store.open()


@root_only
def test_a_secrets_file_through_a_link_or_not_roots_is_refused(shared: Path) -> None:
    cfg = load_config(write_site(shared))
    link = shared / "link.toml"
    link.symlink_to(shared / "secrets.toml")
    with pytest.raises(ConfigError):
        read_secrets_file(link)
    os.chown(shared / "secrets.toml", USER, USER)
    with pytest.raises(ConfigError, match="owned by root"):
        read_secrets_file(cfg.store.secrets_file)


@root_only
def test_bootseer_config_never_prints_secrets(shared: Path) -> None:
    config = write_site(shared)
    bootseer = Path(sys.executable).parent / "bootseer"
    env = {**os.environ, "BOOTSEER_CONFIG": str(config)}
    for cmd in ([str(bootseer), "config"], [str(bootseer), "config", "--check"]):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert SECRET not in r.stdout + r.stderr
        u = as_user("env", f"BOOTSEER_CONFIG={config}", *cmd)
        assert u.returncode == 0, u.stderr
        assert SECRET not in u.stdout + u.stderr
        if "--check" in cmd:
            assert "secrets file" in r.stdout and "ok" in r.stdout, r.stdout
    (shared / "secrets.toml").chmod(0o644)
    r = subprocess.run(
        [str(bootseer), "config", "--check"], env=env, capture_output=True, text=True
    )
    assert r.returncode == 1 and "mode 0600" in r.stdout and SECRET not in r.stdout, r.stdout
    # a user's process opens the store without credentials, even if the file were readable
    code = (
        "from bootseer.config import load_config\n"
        "from bootseer.credentials import store_credentials\n"
        "from pathlib import Path\n"
        f"c = store_credentials(load_config(Path({str(config)!r})).store.secrets_file)\n"
        "print(c.anonymous)\n"
    )
    u = as_user(sys.executable, "-c", code)
    assert u.returncode == 0 and u.stdout.strip() == "True", u.stderr


@root_only
def test_file_store_objects_are_root_only_but_phase_records(shared: Path) -> None:
    old = os.umask(0)  # the modes do not depend on the writer's umask
    try:
        store = open_store(f"file://{shared}/store")
        (shared / "store").chmod(0o755)
        store.write_bytes("deps/user/alice/k/frames.bin", b"alice's config")
        store.write_bytes("ckpt/alice/ns/units/0", b"unit", atomic=False)
        with store.writer("images/manifests/x.json") as out:
            out.write(b"{}")
        assert store.create_exclusive("images/locks/x", b"token")
        store.make_dir("alice/ns/files")
        store.write_bytes("phases/day=1/job=7/rows.parquet", b"rows")
    finally:
        os.umask(old)
    root = shared / "store"
    private = [
        "deps/user/alice/k/frames.bin",
        "ckpt/alice/ns/units/0",
        "images/manifests/x.json",
        "images/locks/x",
    ]
    for key in private:
        assert stat.S_IMODE((root / key).stat().st_mode) == 0o600, key
        assert stat.S_IMODE((root / key).parent.stat().st_mode) == 0o700, key
    assert stat.S_IMODE((root / "deps").stat().st_mode) == 0o700
    assert stat.S_IMODE((root / "alice/ns/files").stat().st_mode) == 0o700
    rows = root / "phases/day=1/job=7/rows.parquet"
    assert stat.S_IMODE(rows.stat().st_mode) == 0o644
    assert stat.S_IMODE(rows.parent.stat().st_mode) == 0o755
    for key in private:
        assert as_user("cat", str(root / key)).returncode != 0, key
    assert as_user("cat", str(rows)).stdout == "rows"
    # a user's read says why it is refused
    code = (
        "from bootseer.store import open_store\n"
        f"open_store('file://{root}').read_bytes('deps/user/alice/k/frames.bin')\n"
    )
    u = as_user(sys.executable, "-c", code)
    assert u.returncode != 0 and "users hold no store credentials" in u.stderr, u.stderr


@root_only
def test_the_ckpt_cli_as_a_user_fails_with_a_clear_message(shared: Path) -> None:
    """What root put on file:// checkpoint targets is root's alone: a user's `bootseer
    ckpt` (get, ls, put) is refused, saying why, and reads nothing."""
    import pwd

    try:
        pwd.getpwnam("alice")
    except KeyError:
        pytest.skip("needs slurm-dev's user alice")
    config = write_site(shared)
    for target in ("t1", "t2"):  # the site makes the targets' roots, never bootseer
        (shared / target).mkdir()
    with config.open("a") as f:
        f.write(f'[ckpt]\ntargets = ["file://{shared}/t1", "file://{shared}/t2"]\n')
    data = shared / "model.bin"
    data.write_bytes(b"alice's weights")
    data.chmod(0o644)
    bootseer = str(Path(sys.executable).parent / "bootseer")
    env = {**os.environ, "BOOTSEER_CONFIG": str(config)}
    r = subprocess.run(
        [bootseer, "ckpt", "--user", "alice", "-q", "put", str(data), "proj:m.bin"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    for args in (["get", "proj:m.bin", "-"], ["ls", "proj"], ["put", str(data), "proj:n.bin"]):
        for user in ("alice", "bob"):
            u = subprocess.run(
                [
                    "setpriv",
                    f"--reuid={user}",
                    f"--regid={user}",
                    "--init-groups",
                    "env",
                    f"BOOTSEER_CONFIG={config}",
                    bootseer,
                    "ckpt",
                    "-q",
                    *args,
                ],
                capture_output=True,
                text=True,
            )
            assert "weights" not in u.stdout and "m.bin" not in u.stdout
            if user == "alice" or args[0] == "put":  # bob's own namespace is empty
                assert u.returncode == 1, (args, user, u.stdout)
                assert "users hold no store credentials" in u.stderr, (args, user, u.stderr)
