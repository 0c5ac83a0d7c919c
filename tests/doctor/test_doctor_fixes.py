"""Issue 22, item 6: each of doctor's fix lines is a command that works on the node as
installed, and a p2p the agent turned off at its start fails doctor."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from bootseer.config import SiteConfig
from bootseer.doctor import Node
from bootseer.doctor.agent import check_p2p
from bootseer.doctor.files import check_site_key
from bootseer.doctor.slurmd import check_plugin, check_plugstack, installed_plugin
from tests.conftest import TEST_PORT_BASE

ROOT = os.geteuid() == 0


def make_node(tmp_path: Path, plugstack: str = "", **sections: dict[str, object]) -> Node:
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    (tmp_path / "plugstack.conf").write_text(plugstack)
    sections.setdefault("paths", {"run_dir": f"{tmp_path}/nodes/%n/run"})
    sections["paths"].setdefault("log_dir", f"{tmp_path}/nodes/%n/log")
    config = tmp_path / "config.toml"
    config.write_text("")
    config.chmod(0o644)
    cfg = SiteConfig.from_mapping(sections, source=config).for_node("n1")
    return Node("n1", conf, config, cfg)


def test_a_missing_plugin_is_put_there_by_the_install_not_by_make(tmp_path: Path) -> None:
    """Before: ``make -C spank install`` (a source tree and a compiler; it installs to
    /usr/local/lib/slurm, not the path plugstack.conf names)."""
    missing = make_node(tmp_path, f"required {tmp_path}/gone/bootseer.so rundir=/r\n")
    check = check_plugstack(missing)
    assert check.status == "problem" and "does not exist" in check.detail
    assert "make" not in check.fix
    assert check.fix.startswith("on the admin machine: bootseer install n1, then set ")
    assert f"required /opt/bootseer/lib/slurm/bootseer.so rundir={tmp_path}/nodes/%n/run" in (
        check.fix
    )
    none = check_plugstack(make_node(tmp_path, "required /x/pyxis.so\n"))
    assert none.fix.startswith("on the admin machine: bootseer install n1, then add to ")
    old = tmp_path / "old" / "bootseer.so"
    old.parent.mkdir()
    old.write_bytes(b"a plugin of before the env file contract")
    stale = check_plugin(make_node(tmp_path, f"required {old}\n"))
    assert stale.status == "problem" and "make" not in stale.fix
    assert "bootseer install n1" in stale.fix


def test_the_installed_plugin_is_the_one_beside_the_installs_venv(tmp_path: Path) -> None:
    """What ``bootseer install`` lays out: <prefix>/venv -> venvs/<digest>, the plugin in
    <prefix>/lib/slurm/; doctor's fix names that file (the plugstack line to write)."""
    prefix = tmp_path / "opt" / "bootseer"
    venv = prefix / "venvs" / "0123456789abcdef"
    venv.mkdir(parents=True)
    (prefix / "venv").symlink_to("venvs/0123456789abcdef")
    assert installed_plugin(venv) is None  # no plugin installed
    so = prefix / "lib" / "slurm" / "bootseer.so"
    so.parent.mkdir(parents=True)
    so.write_bytes(b"")
    assert installed_plugin(venv) == so  # as the resolved venv
    assert installed_plugin(prefix / "venv") == so  # as the link
    assert installed_plugin(tmp_path / "checkout" / "venv") is None


@pytest.mark.root
@pytest.mark.skipif(not ROOT, reason="the key must be root's")
def test_a_site_key_others_could_read_is_rotated_not_only_chmodded(tmp_path: Path) -> None:
    """The fix is run as it is written: the key becomes root's alone, with a new key
    first and the old one kept after it (for what it sealed: docs/security.md)."""
    from bootseer.sitekey import read_key_file

    key = tmp_path / "site.key"
    old = "a" * 64
    key.write_text(old)
    key.chmod(0o644)
    check = check_site_key(make_node(tmp_path, site={"key_file": str(key)}))
    assert check.status == "problem", check
    assert f"chmod 0600 {key}" in check.fix and "rotate" in check.fix
    rotate = r"(.*); then rotate it, [^:]*: (.*); copy it to every node.*"
    commands = re.fullmatch(rotate, check.fix)
    assert commands is not None, check.fix
    script = f"{commands[1]}; {commands[2]}"
    r = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    keys = read_key_file(key)
    assert len(keys) == 2 and keys[1] == old.encode() and len(keys[0]) == 64
    assert check_site_key(make_node(tmp_path, site={"key_file": str(key)})).status == "ok"
    # A key others could change but never read: its mode alone.
    key.chmod(0o620)
    assert "rotate" not in check_site_key(make_node(tmp_path, site={"key_file": str(key)})).fix


def test_an_agent_that_turned_p2p_off_fails_doctor_until_it_restarts(tmp_path: Path) -> None:
    """The agent decides on p2p once, at its start (p2p.node.PeerNode.start, logging to
    its log): a site key it refused then leaves p2p off although the key was fixed since.
    Before, doctor passed every check."""
    from bootseer.linelog import LineLog
    from bootseer.nodepaths import NodePaths
    from bootseer.p2p.node import PeerNode

    key = tmp_path / "site.key"
    key.write_text("b" * 64 + "\n")
    key.chmod(0o644)
    p2p = {"port": TEST_PORT_BASE + 90, "key_file": str(key)}
    node = make_node(tmp_path, site={"key_file": str(key)}, p2p=p2p)
    assert node.cfg is not None
    log_path = NodePaths(node.cfg).agent_log("n1")
    log_path.parent.mkdir(parents=True)
    assert check_p2p(node).status == "skip"  # no agent has said anything yet

    def provide(*_: object) -> bytes:
        raise AssertionError("no peer asks in this test")

    def start() -> PeerNode | None:
        assert node.cfg is not None
        return PeerNode.start(node.cfg.p2p, "n1", provide, LineLog(log_path, "agent"))

    assert start() is None  # the key others can read: p2p off
    check = check_p2p(node)
    assert check.status == "problem", check
    assert "turned p2p off" in check.detail and str(key) in check.detail
    assert "bootseer agent --restart" in check.fix
    key.chmod(0o600)
    assert check_p2p(node).status == "problem"  # the key is fixed, the agent is not
    if not ROOT:
        return  # the agent reads a root-only key only as root
    peers = start()  # the agent restarted
    assert peers is not None
    try:
        assert check_p2p(node).status == "ok", check_p2p(node)
    finally:
        peers.close()
    off = make_node(tmp_path, site={"key_file": str(key)}, p2p={**p2p, "enabled": False})
    assert check_p2p(off).status == "skip"
