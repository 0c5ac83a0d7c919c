"""The snapshot key: what goes in, and key files read with the user's rights only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bootseer.deps.key import (
    KeyInputError,
    KeyInputs,
    hash_key_files,
    hash_key_files_as,
    key_inputs,
    scope_dir,
    snapshot_key,
)
from bootseer.errors import StepError

from .conftest import USER_A, needs_root


def inputs(**kw: object) -> KeyInputs:
    d: dict[str, object] = dict(
        scope="user/ada",
        prefix="/tmp/v",
        key_files=(("r.txt", "0"),),
        image="",
        arch="x86_64",
        os_release="debian 12",
        python="3.11",
        gpu="none",
    )
    d.update(kw)
    return KeyInputs(**d)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "field,value",
    [
        ("scope", "user/bob"),
        ("prefix", "/tmp/w"),
        ("key_files", (("r.txt", "1"),)),
        ("image", "name:pytorch:24.05"),
        ("arch", "aarch64"),
        ("os_release", "debian 13"),
        ("python", "3.12"),
        ("gpu", "driver 550; H100"),
    ],
)
def test_every_input_changes_the_base(field: str, value: object) -> None:
    assert inputs(**{field: value}).base() != inputs().base()


def test_command_changes_the_key_not_the_base() -> None:
    base = inputs().base()
    assert snapshot_key(base, ["pip", "install", "a"]) != snapshot_key(
        base, ["pip", "install", "b"]
    )
    assert snapshot_key(base, None) != snapshot_key(base, [])


def test_key_file_contents_decide(tmp_path: Path) -> None:
    (tmp_path / "r.txt").write_text("numpy==2.0\n")
    one = hash_key_files(["r.txt"], str(tmp_path), 1 << 20)
    (tmp_path / "r.txt").write_text("numpy==2.1\n")
    assert hash_key_files(["r.txt"], str(tmp_path), 1 << 20) != one


def test_key_file_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(KeyInputError, match=r"missing\.txt"):
        hash_key_files(["missing.txt"], str(tmp_path), 1 << 20)
    os.mkdir(tmp_path / "d")
    with pytest.raises(KeyInputError, match="not a regular file"):
        hash_key_files(["d"], str(tmp_path), 1 << 20)
    (tmp_path / "big").write_bytes(b"x" * 100)
    with pytest.raises(KeyInputError, match="larger than"):
        hash_key_files(["big"], str(tmp_path), 10)


@pytest.mark.root
def test_key_file_read_as_the_user_not_root(scratch: Path) -> None:
    """A user naming /etc/shadow (or any root-only file) learns nothing from the prolog."""
    needs_root()
    secret = scratch / "secret"
    secret.write_text("root only\n")
    os.chmod(secret, 0o600)
    with pytest.raises(KeyInputError) as err:
        hash_key_files_as(
            USER_A,
            USER_A,
            [USER_A],
            [str(secret), "/etc/shadow"],
            str(scratch),
            1 << 20,
            timeout=10,
        )
    assert "Permission denied" in str(err.value)
    assert "root only" not in str(err.value)
    mine = scratch / "mine.txt"
    mine.write_text("ok\n")
    os.chown(mine, USER_A, USER_A)
    os.chmod(mine, 0o600)
    got = hash_key_files_as(USER_A, USER_A, [USER_A], ["mine.txt"], str(scratch), 1 << 20, 10)
    assert got == hash_key_files(["mine.txt"], str(scratch), 1 << 20)


def test_scope_dirs_come_from_the_job_not_the_option() -> None:
    assert scope_dir("user", "ada", "phys") == "user/ada"
    assert scope_dir("account", "ada", "phys") == "account/phys"
    assert scope_dir("cluster", "ada", "phys") == "cluster"
    with pytest.raises(StepError):
        scope_dir("account", "ada", "")
    with pytest.raises(StepError):
        scope_dir("account", "ada", "../x")


def test_image_stands_for_os_and_python() -> None:
    ki = key_inputs(
        scope="user/ada", prefix="/tmp/v", key_files=[], image="pytorch:24.05", python="/bin/false"
    )
    assert (ki.os_release, ki.python, ki.image) == ("image", "image", "name:pytorch:24.05")
