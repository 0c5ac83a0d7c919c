from __future__ import annotations

import pytest

from bootseer.errors import OptionError
from bootseer.options import DepsSpec, Options, parse_ckpt, parse_deps, parse_image, parse_options

# Shared with tests/plugin/test_options_spank.py, which checks that the SPANK
# plugin accepts exactly the same values at submit time.
GOOD = {
    "image": ["/shared/images/pytorch.sqsh", "pytorch", "pytorch:24.05", "a-b.c_d:T-1.2"],
    "deps": [
        "/tmp/venv",
        "prefix=/tmp/venv",
        "/tmp/venv,key=req.txt",
        "/opt/env,key=/home/u/req.txt,key=a/b.lock,scope=account",
    ],
    "ckpt": ["llama", "team/llama-25b", "a.b_c/d-e"],
}
BAD = {
    "image": [
        "",
        "relative/path.sqsh",
        "pytorch\n",
        "/a\n",
        "/a/../b",
        "/a/./b",
        "Pytorch",
        "py torch",
        "/a b",
        "name:",
        "/x;rm",
        "x" * 200,
    ],
    "deps": [
        "",
        "venv",
        "/",
        "/tmp/venv,key=../x",
        "/tmp/venv,scope=world",
        "/tmp/venv,foo=1",
        "/tmp/venv,key",
        "/tmp/../venv",
    ],
    "ckpt": ["", "/abs", "a\n", "../x", "a/../b", "a//b", "a/", "a b", "a\nb", "x" * 300],
}


@pytest.mark.parametrize("value", GOOD["image"])
def test_good_images(value: str) -> None:
    assert parse_image(value) == value


@pytest.mark.parametrize("value", BAD["image"])
def test_bad_images(value: str) -> None:
    with pytest.raises(OptionError, match="--bootseer-image"):
        parse_image(value)


@pytest.mark.parametrize("value", BAD["deps"])
def test_bad_deps(value: str) -> None:
    with pytest.raises(OptionError, match="--bootseer-deps"):
        parse_deps(value)


@pytest.mark.parametrize("value", BAD["ckpt"])
def test_bad_ckpt(value: str) -> None:
    with pytest.raises(OptionError, match="--bootseer-ckpt"):
        parse_ckpt(value)


def test_deps_fields() -> None:
    assert parse_deps("/opt/env/,key=req.txt,key=b.lock,scope=cluster") == DepsSpec(
        "/opt/env", ("req.txt", "b.lock"), "cluster"
    )


def test_any_value_option_implies_bootseer() -> None:
    assert parse_options(None, None, None, None) == Options()
    assert not Options().enabled
    opts = parse_options(None, None, None, "team/run1")
    assert opts.enabled and opts.mode == "on" and opts.ckpt == "team/run1"
    assert parse_options("refresh", None, None, None).mode == "refresh"
    with pytest.raises(OptionError, match="MODE"):
        parse_options("turbo", None, None, None)
