"""``bootseer doctor``'s checks, on files in a temporary directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bootseer import doctor, nodepaths
from bootseer.config import SiteConfig
from bootseer.doctor import Check, Node, result
from bootseer.doctor.agent import check_agent, check_metrics
from bootseer.doctor.files import check_config, check_site_key, check_store_secrets
from bootseer.doctor.host import check_path, check_python, others_cannot_run
from bootseer.doctor.slurmd import check_hooks, check_plugin, check_plugstack, check_timeout
from bootseer.doctor.store import check_clock, check_phase_privacy, check_store
from bootseer.errors import ConfigError, NoSiteConfig

ROOT = os.geteuid() == 0


def make_node(
    tmp_path: Path, slurm: str = "", plugstack: str | None = None, **sections: dict[str, object]
) -> Node:
    """A node whose slurm.conf holds ``slurm`` (plugstack.conf next to it) and whose site
    config is ``sections`` (``[paths] run_dir`` under tmp_path unless given)."""
    conf = tmp_path / "slurm.conf"
    conf.write_text(slurm)
    if plugstack is not None:
        (tmp_path / "plugstack.conf").write_text(plugstack)
    sections.setdefault("paths", {"run_dir": f"{tmp_path}/nodes/%n/run"})
    config = tmp_path / "config.toml"
    config.write_text("")
    config.chmod(0o644)
    cfg = SiteConfig.from_mapping(sections, source=config).for_node("n1")
    return Node("n1", conf, config, cfg)


def plugin(tmp_path: Path) -> Path:
    so = tmp_path / "bootseer.so"
    so.write_bytes(b"")
    return so


def hook(tmp_path: Path, name: str) -> Path:
    """A slurm-dev style wrapper that execs bootseer's hook."""
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\nexec /opt/bootseer/src/{name}/bootseer-{name}\n")
    path.chmod(0o755)
    return path


def good_slurm_conf(tmp_path: Path, flags: str = "Alloc", timeout: str = "180") -> str:
    return (
        f"Prolog={hook(tmp_path, 'prolog')}\nEpilog={hook(tmp_path, 'epilog')}\n"
        f"PrologFlags={flags}\nPrologEpilogTimeout={timeout}\n"
    )


# -- checks ----------------------------------------------------------------------------


def test_plugstack_rundir_matching_the_config_is_ok(tmp_path: Path) -> None:
    line = f"required {plugin(tmp_path)} rundir={tmp_path}/nodes/%n/run\n"
    check = check_plugstack(make_node(tmp_path, plugstack=line))
    assert check.status == "ok", check


def test_plugstack_with_a_mismatched_rundir_is_reported(tmp_path: Path) -> None:
    ps = tmp_path / "ps.conf"
    ps.write_text(f"required {plugin(tmp_path)} rundir=/run/elsewhere\n")
    check = check_plugstack(make_node(tmp_path, slurm=f"PlugStackConfig={ps}\n"))
    assert check.status == "problem"
    assert "rundir=/run/elsewhere" in check.detail
    assert f"{tmp_path}/nodes/%n/run" in check.detail
    assert f"{ps}:1" in check.fix


def test_plugstack_without_the_plugin_is_reported(tmp_path: Path) -> None:
    check = check_plugstack(make_node(tmp_path, plugstack="required /x/pyxis.so\n"))
    assert check.status == "problem"
    assert "no bootseer.so line" in check.detail
    assert f"rundir={tmp_path}/nodes/%n/run" in check.fix  # one line for every node


def test_plugstack_naming_a_missing_plugin_is_reported(tmp_path: Path) -> None:
    line = f"required {tmp_path}/bootseer.so rundir={tmp_path}/nodes/%n/run\n"
    check = check_plugstack(make_node(tmp_path, plugstack=line))
    assert check.status == "problem"
    assert "does not exist" in check.detail


SPANK = Path(__file__).resolve().parents[2] / "spank"


def test_a_plugin_of_this_bootseers_contract_is_ok(tmp_path: Path) -> None:
    so = SPANK / "bootseer.so"  # scripts/bootstrap builds it
    if not so.exists():
        pytest.skip("needs the built plugin (make -C spank)")
    check = check_plugin(make_node(tmp_path, plugstack=f"required {so}\n"))
    assert check.status == "ok", check
    assert f"contract {nodepaths.ENV_CONTRACT}" in check.detail


@pytest.mark.parametrize(
    ("contents", "said"),
    [
        (b"\x7fELF...plugin_name\0bootseer\0", "predates the env file contract"),
        (b"\x7fELF...bootseer-spank-contract=1;\0", "reads env file contract 1"),
        (b"\x7fELF...bootseer-spank-contract=3;\0", "reads env file contract 3"),
    ],
)
def test_a_plugin_of_another_contract_is_reported(
    tmp_path: Path, contents: bytes, said: str
) -> None:
    # A relative name in plugstack.conf is looked for in slurm.conf's PluginDir.
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "bootseer.so").write_bytes(contents)
    node = make_node(
        tmp_path, slurm=f"PluginDir=/nowhere:{tmp_path}/lib\n", plugstack="required bootseer.so\n"
    )
    check = check_plugin(node)
    assert check.status == "problem", check
    assert said in check.detail and "no BOOTSEER_* variables" in check.detail
    assert "bootseer install" in check.fix


def test_no_plugin_file_is_left_to_the_plugstack_check(tmp_path: Path) -> None:
    check = check_plugin(make_node(tmp_path, plugstack="required /x/pyxis.so\n"))
    assert check.status == "skip"


def test_hooks_in_slurm_conf_are_ok(tmp_path: Path) -> None:
    check = check_hooks(make_node(tmp_path, good_slurm_conf(tmp_path, "Contain,X11")))
    assert check.status == "ok", check


def test_prolog_flags_without_alloc_are_reported(tmp_path: Path) -> None:
    check = check_hooks(make_node(tmp_path, good_slurm_conf(tmp_path, "X11")))
    assert check.status == "problem"
    assert "lacks Alloc" in check.detail
    assert "PrologFlags=X11,Alloc" in check.fix  # added to the site's flags, not replacing


def test_a_prolog_that_is_not_bootseers_is_reported(tmp_path: Path) -> None:
    other = tmp_path / "site-prolog"
    other.write_text("#!/bin/sh\ntrue\n")
    other.chmod(0o755)
    slurm = good_slurm_conf(tmp_path).replace(f"Prolog={tmp_path}/prolog", f"Prolog={other}")
    check = check_hooks(make_node(tmp_path, slurm))
    assert check.status == "problem"
    assert "does not run bootseer-prolog" in check.detail


def test_a_prolog_directory_glob_is_followed(tmp_path: Path) -> None:
    d = tmp_path / "prolog.d"
    d.mkdir()
    hook(tmp_path, "prolog").rename(d / "50-bootseer")
    slurm = good_slurm_conf(tmp_path).replace(f"Prolog={tmp_path}/prolog", f"Prolog={d}/*")
    assert check_hooks(make_node(tmp_path, slurm)).status == "ok"


def test_a_timeout_shorter_than_the_deadlines_is_reported(tmp_path: Path) -> None:
    slurm = good_slurm_conf(tmp_path, timeout="60")
    node = make_node(tmp_path, slurm, hooks={"prolog_deadline": 90})
    check = check_timeout(node)
    assert check.status == "problem"
    assert "90s deadline" in check.detail
    assert check_timeout(make_node(tmp_path, good_slurm_conf(tmp_path))).ok


def test_missing_slurm_conf_is_reported(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    node.slurm_conf = tmp_path / "absent.conf"
    check = check_hooks(node)
    assert check.status == "problem"
    assert "cannot read" in check.detail


def test_a_missing_config_at_the_default_path_is_a_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BOOTSEER_CONFIG", raising=False)
    monkeypatch.setattr("bootseer.config.DEFAULT_PATH", tmp_path / "absent.toml")
    node = Node.here("n1")
    assert node.cfg is None
    check = check_config(node)
    assert check.status == "problem"
    assert "defaults" in check.detail
    # Checks that need the config say so rather than judging the defaults.
    assert check_store(node).status == "skip"


def test_a_missing_config_is_told_by_its_kind_not_its_words(tmp_path: Path) -> None:
    # The config check decides on the error's class: a NoSiteConfig however worded is
    # the missing config; a bad config's error starting with the same words is not.
    node = make_node(tmp_path)
    missing = Node("n1", node.slurm_conf, node.config_path, None, NoSiteConfig("gone"))
    check = check_config(missing)
    assert check.status == "problem"
    assert check.detail == (
        f"no site config at {node.config_path} (bootseer would use defaults: a node-local store)"
    )
    assert check.fix.startswith(f"write {node.config_path}")
    bad = Node("n1", node.slurm_conf, node.config_path, None, ConfigError("no site config key"))
    check = check_config(bad)
    assert (check.detail, check.fix) == ("no site config key", f"fix {node.config_path}")


def test_a_bad_config_is_a_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[hooks]\nstrict = 1\n")
    monkeypatch.setenv("BOOTSEER_CONFIG", str(path))
    check = check_config(Node.here("n1"))
    assert check.status == "problem"
    assert "hooks.strict" in check.detail


@pytest.mark.root
@pytest.mark.skipif(not ROOT, reason="the config must be root's")
def test_config_modes(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    assert check_config(node).status == "ok"
    node.config_path.chmod(0o600)
    assert "cannot read" in check_config(node).detail
    node.config_path.chmod(0o666)
    assert "others may change it" in check_config(node).detail


def test_a_site_key_readable_by_others_is_reported(tmp_path: Path) -> None:
    key = tmp_path / "site.key"
    key.write_text("k" * 64 + "\n")
    key.chmod(0o644)
    check = check_site_key(make_node(tmp_path, site={"key_file": str(key)}))
    assert check.status == "problem"
    assert "mode 0644" in check.detail
    assert f"chmod 0600 {key}" in check.fix


def test_a_missing_site_key_is_reported(tmp_path: Path) -> None:
    check = check_site_key(make_node(tmp_path, site={"key_file": f"{tmp_path}/k"}))
    assert check.status == "problem"
    assert "umask 077" in check.fix


@pytest.mark.root
@pytest.mark.skipif(not ROOT, reason="the key must be root's")
def test_a_root_only_site_key_is_ok(tmp_path: Path) -> None:
    key = tmp_path / "site.key"
    key.write_text("k" * 64 + "\n")
    key.chmod(0o600)
    check = check_site_key(make_node(tmp_path, site={"key_file": str(key)}))
    assert check.status == "ok", check


def test_store_secrets_others_can_read_are_reported(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    assert node.cfg is not None and node.cfg.store.secrets_file == tmp_path / "secrets.toml"
    assert check_store_secrets(node).status == "ok"  # absent: anonymous
    secrets = tmp_path / "secrets.toml"
    secrets.write_text('[store]\naccess_key = "a"\nsecret_key = "never-shown"\n')
    secrets.chmod(0o644)
    check = check_store_secrets(node)
    assert check.status == "problem" and "mode 0644" in check.detail, check
    assert f"chmod 0600 {secrets}" in check.fix
    assert "never-shown" not in check.detail + check.fix
    if ROOT:
        secrets.chmod(0o600)
        check = check_store_secrets(node)
        assert check.status == "ok" and "keys set" in check.detail, check
        assert "never-shown" not in check.detail


def test_a_store_that_does_not_exist_is_reported_and_not_created(tmp_path: Path) -> None:
    node = make_node(tmp_path, store={"uri": f"file://{tmp_path}/shared/bootseer"})
    check = check_store(node)
    assert check.status == "problem"
    assert "does not exist" in check.detail
    assert not (tmp_path / "shared").exists()
    assert check_clock(node).status == "skip"


def test_a_store_users_can_write_is_reported(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    node = make_node(tmp_path, store={"uri": f"file://{store}"})
    store.chmod(0o755)
    assert check_store(node).status == "ok"
    store.chmod(0o1777)
    check = check_store(node)
    assert check.status == "problem"
    assert "every user can write" in check.detail


def test_clock_against_a_file_store(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    check = check_clock(make_node(tmp_path, store={"uri": f"file://{store}"}))
    assert check.status == "ok", check
    assert list(store.iterdir()) == []  # the probe is gone


def test_no_agent_is_reported(tmp_path: Path) -> None:
    check = check_agent(make_node(tmp_path))
    assert check.status == "problem"
    assert f"{tmp_path}/nodes/n1/run/agent.sock" in check.detail
    assert "bootseer-agent" in check.fix


def test_python_has_the_tarfile_filter(tmp_path: Path) -> None:
    assert check_python(make_node(tmp_path)).status == "ok"


def test_others_cannot_run() -> None:
    # Not under pytest's tmp_path: its root is root's alone (0700).
    top = Path(tempfile.mkdtemp(prefix="bootseer-doctor-", dir="/var/tmp"))
    try:
        top.chmod(0o755)
        d = top / "venv" / "bin"
        d.mkdir(parents=True, mode=0o755)
        (top / "venv").chmod(0o755)
        exe = d / "bootseer"
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
        assert others_cannot_run(exe) is None
        (top / "venv").chmod(0o700)
        assert others_cannot_run(exe) == top / "venv"
        (top / "venv").chmod(0o755)
        exe.chmod(0o750)
        assert others_cannot_run(exe) == exe
    finally:
        shutil.rmtree(top)


def test_path_check_finds_bootseer_on_users_path(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "bootseer").write_text("#!/bin/sh\n")
    (bin_dir / "bootseer").chmod(0o700)
    node.user_path = str(bin_dir)
    check = check_path(node)
    assert check.status == "problem"
    assert "not executable by others" in check.detail


def test_a_check_that_raises_is_a_problem(tmp_path: Path) -> None:
    def check_boom(node: Node) -> Check:
        raise OSError("boom")

    (check,) = doctor.run_checks(make_node(tmp_path), (check_boom,))
    assert (check.name, check.status) == ("boom", "problem")


def test_output_fits_80_columns_and_prints_markup_as_text(tmp_path: Path) -> None:
    from bootseer.doctor import render

    checks = [
        result.ok("config", "/x/[bold]y[/bold] " + "z" * 200),
        result.problem("plugstack", "p" * 100, "f" * 30 + " " + "g " * 80),
        result.skip("clock", "no store"),
    ]
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        render(checks)
    lines = out.getvalue().splitlines()
    assert all(len(ln) <= 80 for ln in lines), lines
    assert lines[0].startswith("ok   config    /x/[bold]y[/bold] z")
    assert lines[1].startswith("FAIL plugstack ppp")
    # A problem's finding is shown whole, wrapped under its name, then what to change.
    assert "".join(ln.strip() for ln in lines[1:3]) == "FAIL plugstack " + "p" * 100
    assert lines[3].startswith(" " * 15 + "fix: fff")
    assert lines[-1].startswith("skip clock")


def test_cli_json_and_exit_status(tmp_path: Path) -> None:
    import json

    env = {**os.environ, "BOOTSEER_CONFIG": str(tmp_path / "absent.toml")}
    env["SLURM_CONF"] = str(tmp_path / "slurm.conf")
    r = subprocess.run(
        [sys.executable, "-m", "bootseer.cli", "doctor", "--json", "--node", "n1"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["node"] == "n1" and doc["ok"] is False
    by_name = {c["name"]: c for c in doc["checks"]}
    assert by_name["config"]["status"] == "problem"
    assert by_name["python"]["status"] == "ok"


def test_config_check_fails_for_a_store_that_does_not_exist(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'[store]\nuri = "file://{tmp_path}/absent"\n')
    r = subprocess.run(
        [sys.executable, "-m", "bootseer.cli", "config", "--check"],
        env={**os.environ, "BOOTSEER_CONFIG": str(config)},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1
    assert "does not exist" in r.stdout
    assert not (tmp_path / "absent").exists()


# -- many nodes ------------------------------------------------------------------------


def fake_rsh(tmp_path: Path, body: str) -> str:
    """An executable standing in for ssh: ``$1`` the node, ``$2`` the command line."""
    rsh = tmp_path / "rsh"
    rsh.write_text(f"#!/bin/sh\n{body}\n")
    rsh.chmod(0o755)
    return str(rsh)


def test_nodes_are_asked_through_rsh_and_folded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from bootseer.doctor import render_nodes

    # Each "node" runs bootseer doctor here, with a config naming a store only n2 lacks.
    (tmp_path / "store-n1").mkdir()
    (tmp_path / "store-n3").mkdir()
    for n in ("n1", "n2", "n3"):
        (tmp_path / f"{n}.toml").write_text(f'[store]\nuri = "file://{tmp_path}/store-{n}"\n')
    rsh = fake_rsh(
        tmp_path,
        '[ "$1" = n4 ] && { echo "ssh: n4: No route to host" >&2; exit 255; }\n'
        f'BOOTSEER_CONFIG={tmp_path}/$1.toml exec sh -c "$2"',
    )
    bootseer = str(Path(sys.executable).parent / "bootseer")
    answers = doctor.ask_nodes(["n1", "n2", "n3", "n4"], rsh, bootseer, fanout=2)
    assert [a.node for a in answers] == ["n1", "n2", "n3", "n4"]
    stores = {a.node: {c.name: c for c in a.checks}.get("store") for a in answers}
    assert stores["n1"] is not None and stores["n1"].status == "ok"
    assert stores["n2"] is not None and "does not exist" in stores["n2"].detail
    assert answers[3].error == "ssh: n4: No route to host" and not answers[3].ok

    capsys.readouterr()
    render_nodes(answers)
    out = capsys.readouterr().out
    assert all(len(ln) <= 80 for ln in out.splitlines()), out
    assert "FAIL store on n2\n" in out
    assert "DOWN n4: ssh: n4: No route to host" in out


def test_an_unreachable_node_says_why(tmp_path: Path) -> None:
    rsh = fake_rsh(
        tmp_path, 'echo "ssh: connect to host $1 port 22: No route to host" >&2; exit 255'
    )
    (answer,) = doctor.ask_nodes(["n7"], rsh)
    assert answer.error == "ssh: connect to host n7 port 22: No route to host"
    assert answer.to_json()["ok"] is False


def test_a_nodeset_cli_exit_status_and_json(tmp_path: Path) -> None:
    import json

    rsh = fake_rsh(tmp_path, 'exec sh -c "$2"')
    env = {**os.environ, "BOOTSEER_CONFIG": str(tmp_path / "absent.toml")}
    r = subprocess.run(
        [sys.executable, "-m", "bootseer.cli", "doctor", "n[1-2]", "--rsh", rsh, "--json"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and sorted(doc["nodes"]) == ["n1", "n2"]


def test_public_phase_records_on_a_slurm_that_hides_jobs_are_reported(tmp_path: Path) -> None:
    """With Slurm's PrivateData=jobs, mallory cannot see alice's jobs in squeue, but
    `bootseer report` read her phase records (their failures, script path) while
    [store] public_phases kept its default: nothing said so."""
    hidden = make_node(tmp_path, "PrivateData=usage,Jobs\n")
    c = check_phase_privacy(hidden)
    assert c.status == doctor.PROBLEM and "PrivateData=usage,Jobs" in c.detail, c
    assert "public_phases = false" in c.fix
    (tmp_path / "private").mkdir()
    private = make_node(tmp_path / "private", "PrivateData=jobs\n", store={"public_phases": False})
    assert check_phase_privacy(private).status == doctor.OK
    (tmp_path / "open").mkdir()
    assert check_phase_privacy(make_node(tmp_path / "open", "")).status == doctor.OK
    assert check_phase_privacy in doctor.CHECKS


def test_metrics_unset_is_a_skip_and_a_missing_dir_a_problem(tmp_path: Path) -> None:
    assert check_metrics(make_node(tmp_path)).status == "skip"
    d = tmp_path / "metrics"
    check = check_metrics(make_node(tmp_path, metrics={"textfile_dir": str(d)}))
    assert check.status == "problem" and "write no metrics" in check.detail
    assert f"mkdir -p {d}" in check.fix


def test_a_metrics_dir_others_may_write_is_reported(tmp_path: Path) -> None:
    d = tmp_path / "metrics"
    d.mkdir()
    d.chmod(0o777)
    check = check_metrics(make_node(tmp_path, metrics={"textfile_dir": str(d)}))
    assert check.status == "problem" and "mode 0777" in check.detail


@pytest.mark.root
@pytest.mark.skipif(not ROOT, reason="the directory must be root's")
def test_a_stale_or_missing_agent_file_is_reported_and_a_fresh_one_is_ok(tmp_path: Path) -> None:
    d = tmp_path / "metrics"
    d.mkdir(mode=0o755)
    node = make_node(tmp_path, metrics={"textfile_dir": str(d), "interval": 10})
    check = check_metrics(node)
    assert check.status == "problem" and "has written no metrics" in check.detail
    f = d / "bootseer_agent.prom"
    f.write_text("bootseer_agent_up 1\n")
    os.utime(f, (0, 1e9))
    check = check_metrics(node)
    assert check.status == "problem" and "stopped writing" in check.detail
    os.utime(f)
    assert check_metrics(node).status == "ok"
