"""The site key: sealing, opening, rotation, the key file's checks, one key file for p2p."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bootseer import sitekey
from bootseer.config import SiteConfig
from bootseer.errors import ConfigError
from bootseer.p2p.auth import load_site_key
from bootseer.sitekey import SealError, SiteKeys, load_keys, read_key_file
from tests.sitekeys import KEY, KEYS, key_file

pytestmark = pytest.mark.root

OLD = b"the-old-site-key-0123456789abcdef"
NEW = b"the-new-site-key-0123456789abcdef"


def test_a_sealed_record_opens_for_its_purpose_and_place_only() -> None:
    raw = KEYS.seal("deps.ref", "deps/user/ada/refs/1.json", b'{"key":"2"}')
    assert raw.startswith(b'{"key":"2","mac":"')
    assert KEYS.open("deps.ref", "deps/user/ada/refs/1.json", raw) == b'{"key":"2"}'
    with pytest.raises(SealError, match="does not verify"):
        KEYS.open("deps.manifest", "deps/user/ada/refs/1.json", raw)  # another purpose
    with pytest.raises(SealError, match="does not verify"):
        KEYS.open("deps.ref", "deps/user/bob/refs/1.json", raw)  # moved
    with pytest.raises(SealError, match="does not verify"):
        KEYS.open("deps.ref", "deps/user/ada/refs/1.json", raw.replace(b'"2"', b'"3"'))
    with pytest.raises(SealError, match="not sealed"):
        KEYS.open("deps.ref", "deps/user/ada/refs/1.json", b'{"key":"2"}')
    other = SiteKeys([b"x" * 32])
    with pytest.raises(SealError, match="does not verify"):
        other.open("deps.ref", "deps/user/ada/refs/1.json", raw)
    assert KEYS.open("image.name", "n", KEYS.seal("image.name", "n", b"{}")) == b"{}"


def test_subkeys_differ_per_purpose_and_from_the_key() -> None:
    a, b = KEYS.subkeys("deps.ref")[0], KEYS.subkeys("deps.manifest")[0]
    assert len({a, b, KEY}) == 3


def test_without_keys_a_reader_strips_and_a_writer_does_not_seal() -> None:
    raw = KEYS.seal("image.path", "n", b'{"a":1}')
    assert sitekey.open_with(None, "image.path", "n", raw) == b'{"a":1}'
    assert sitekey.open_with(None, "image.path", "n", b'{"a":1}') == b'{"a":1}'
    assert sitekey.seal_with(None, "image.path", "n", b'{"a":1}') == b'{"a":1}'


def test_missing_keys_refuse_everything_and_say_why() -> None:
    none = SiteKeys((), missing="[site] key_file /nope: No such file or directory")
    with pytest.raises(SealError, match=r"no site key.*/nope"):
        none.open("image.path", "n", KEYS.seal("image.path", "n", b'{"a":1}'))
    with pytest.raises(SealError, match="no site key"):
        none.seal("image.path", "n", b'{"a":1}')


def test_a_rotated_key_still_opens_old_records_and_new_ones_use_the_first(
    tmp_path: Path,
) -> None:
    old = load_keys(key_file(tmp_path, OLD, name="old.key"))
    record = old.seal("image.trace", "images/traces/x.json", b'{"t":1}')
    rotated = load_keys(key_file(tmp_path, NEW, OLD, name="rotated.key"))
    assert rotated.open("image.trace", "images/traces/x.json", record) == b'{"t":1}'
    fresh = rotated.seal("image.trace", "images/traces/x.json", b'{"t":1}')
    assert SiteKeys([NEW]).open("image.trace", "images/traces/x.json", fresh) == b'{"t":1}'
    with pytest.raises(SealError):
        old.open("image.trace", "images/traces/x.json", fresh)
    # Once the old line is dropped, what only it sealed no longer opens.
    dropped = load_keys(key_file(tmp_path, NEW, name="rotated.key"))
    with pytest.raises(SealError):
        dropped.open("image.trace", "images/traces/x.json", record)


def test_the_key_file_is_reread_when_it_changes(tmp_path: Path) -> None:
    path = key_file(tmp_path, OLD)
    assert load_keys(path).keys == (OLD,)
    assert load_keys(path) is load_keys(path)  # read once
    key_file(tmp_path, NEW, OLD)
    assert load_keys(path).keys == (NEW, OLD)


def test_the_key_file_must_be_roots_alone(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("a root-owned key file needs root")
    path = key_file(tmp_path)
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="mode 0600"):
        read_key_file(path)
    assert "mode 0600" in load_keys(path).missing
    path.chmod(0o600)
    os.chown(path, 1, 1)
    with pytest.raises(ConfigError, match="owned by root"):
        read_key_file(path)
    short = tmp_path / "short.key"
    short.write_bytes(b"# comment\n\nshort\n")
    short.chmod(0o600)
    with pytest.raises(ConfigError, match="at least 16"):
        read_key_file(short)
    link = tmp_path / "link.key"
    link.symlink_to(key_file(tmp_path, name="real.key"))
    with pytest.raises(ConfigError):
        read_key_file(link)


def test_comments_and_blank_lines_are_not_keys(tmp_path: Path) -> None:
    path = tmp_path / "k"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"# rotated 2025-01\n" + NEW + b"\n\n" + OLD + b"\n")
    os.close(fd)
    assert read_key_file(path) == [NEW, OLD]


def test_p2p_uses_the_site_key_file_and_its_first_key(tmp_path: Path) -> None:
    path = key_file(tmp_path, NEW, OLD)
    cfg = SiteConfig.from_mapping({"site": {"key_file": str(path)}})
    assert cfg.p2p.key_file == path
    assert load_site_key(cfg.p2p.key_file) == NEW
    # A config from before [site]: its [p2p] key_file is the site's key too.
    legacy = SiteConfig.from_mapping({"p2p": {"key_file": str(path)}})
    assert legacy.site.key_file == path
    both = SiteConfig.from_mapping(
        {"site": {"key_file": str(path)}, "p2p": {"key_file": "/etc/other.key"}}
    )
    assert (both.site.key_file, both.p2p.key_file) == (path, Path("/etc/other.key"))
    assert SiteConfig().site.key_file == SiteConfig().p2p.key_file
