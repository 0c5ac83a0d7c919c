"""The version a node runs and the one before (install.releases), on a real directory
tree: the node-side script run by this machine's Python, as the install runs it on a
node over SSH (the SSH part: test_install_ssh.py's rollback test)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import cast

import pytest

from bootseer.install import releases
from bootseer.install.layout import Layout
from bootseer.install.remote import Node, RemoteError, Result

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="the script gives root the files it puts back"),
]


class Here:
    """What the script needs of a node: a command run, stdin in, stdout out."""

    name = "here"

    def run(self, argv: list[str], stdin: bytes = b"", timeout: float = 600) -> Result:
        r = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout)
        return Result(r.returncode, r.stdout.decode(), r.stderr.decode())


def version(lay: Layout, name: str, plugin: bytes, docs: dict[str, bytes]) -> list[Path]:
    """Put a version's venv (a stand-in, complete) and files in place, as install does."""
    venv = lay.venvs / name
    venv.mkdir(parents=True, exist_ok=True)
    (venv / ".complete").touch()
    tmp = lay.prefix / ".venv.tmp"
    tmp.symlink_to(venv.relative_to(lay.prefix))
    os.replace(tmp, lay.venv)
    lay.plugin.parent.mkdir(parents=True, exist_ok=True)
    lay.plugin.write_bytes(plugin)
    lay.plugin.chmod(0o755)
    lay.docs.mkdir(parents=True, exist_ok=True)
    for old in lay.docs.iterdir():
        old.unlink()
    for doc, text in docs.items():
        (lay.docs / doc).write_bytes(text)
    return [lay.plugin, *(lay.docs / d for d in docs)]


def test_rollback_swaps_the_venv_and_files_and_keeps_what_ran(tmp_path: Path) -> None:
    lay = Layout(prefix=tmp_path / "opt", etc=tmp_path / "etc", unit_dir=None)
    node = cast(Node, Here())
    py = "/usr/bin/python3"
    with pytest.raises(RemoteError, match="no previous version kept here"):
        releases.rollback(node, py, lay)
    releases.record(node, py, lay, version(lay, "a", b"plugin A", {"a.md": b"A"}))
    assert releases.keep(node, py, lay) == ""
    files_b = version(lay, "b", b"plugin B", {"a.md": b"A", "new.md": b"only in B"})
    releases.record(node, py, lay, files_b)

    would = releases.rollback(node, py, lay, dry_run=True)
    assert would.venv == "venvs/a" and os.readlink(lay.venv) == "venvs/b"
    done = releases.rollback(node, py, lay)
    assert done.venv == "venvs/a" and done.swap
    assert sorted(done.files) == [str(lay.plugin), str(lay.docs / "new.md")]
    assert os.readlink(lay.venv) == "venvs/a"
    assert lay.plugin.read_bytes() == b"plugin A" and oct(lay.plugin.stat().st_mode)[-3:] == "755"
    assert sorted(p.name for p in lay.docs.iterdir()) == ["a.md"]  # B's own doc is gone

    back = releases.rollback(node, py, lay)  # forward again: B was kept
    assert back.venv == "venvs/b" and lay.plugin.read_bytes() == b"plugin B"
    assert (lay.docs / "new.md").read_bytes() == b"only in B"

    # A node changed since its install (here, by hand) is not kept over the previous.
    lay.plugin.write_bytes(b"patched")
    assert "changed since" in releases.keep(node, py, lay)
    # A kept copy that was damaged is refused, and nothing changes.
    manifest = (lay.previous / "manifest.json").read_text()
    assert '"venvs/a"' in manifest
    for f in (lay.previous / "files").iterdir():
        f.write_bytes(b"damaged")
    with pytest.raises(RemoteError, match="is damaged"):
        releases.rollback(node, py, lay)
    assert os.readlink(lay.venv) == "venvs/b" and lay.plugin.read_bytes() == b"patched"
