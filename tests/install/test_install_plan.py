"""bootseer install's pure parts: the slurm.conf lines (additions, never replacements),
the layout per node, the files a node gets, the folded summary."""

from __future__ import annotations

from pathlib import Path

import pytest

from bootseer.errors import BootseerError
from bootseer.install.fanout import each, fold
from bootseer.install.files import agent_unit, hook_wrapper
from bootseer.install.layout import Layout
from bootseer.install.node import NodeReport
from bootseer.install.slurmconf import plugstack_line, slurm_conf_lines

LAYOUT = Layout()


def test_prolog_flags_keep_the_sites_own() -> None:
    lines = slurm_conf_lines(LAYOUT, {"prologflags": "Contain,X11"}, 90)
    assert "PrologFlags=Contain,X11,Alloc,DeferBatch" in lines
    assert slurm_conf_lines(LAYOUT, {}, 90)[2] == "PrologFlags=Alloc,DeferBatch"
    have = {"prologflags": "alloc,deferbatch"}
    assert not [x for x in slurm_conf_lines(LAYOUT, have, 90) if "Flags" in x]


def test_a_sites_own_prolog_stays_in_the_list() -> None:
    lines = slurm_conf_lines(LAYOUT, {"prolog": "/etc/slurm/site-prolog"}, 90)
    assert lines[0] == "Prolog=/etc/slurm/site-prolog,/opt/bootseer/libexec/bootseer-prolog"
    assert lines[1] == "Epilog=/opt/bootseer/libexec/bootseer-epilog"
    ours = {"prolog": str(LAYOUT.hook("prolog")), "epilog": str(LAYOUT.hook("epilog"))}
    assert not [
        x for x in slurm_conf_lines(LAYOUT, ours, 90) if x.startswith(("Prolog=", "Epilog="))
    ]


def test_the_timeout_is_raised_only_when_it_leaves_no_room() -> None:
    assert "PrologEpilogTimeout=110" in slurm_conf_lines(LAYOUT, {}, 90)
    assert "PrologEpilogTimeout=110" in slurm_conf_lines(LAYOUT, {"prologepilogtimeout": "95"}, 90)
    long = slurm_conf_lines(LAYOUT, {"prologepilogtimeout": "300"}, 90)
    assert not [x for x in long if x.startswith("PrologEpilogTimeout")]


def test_plugstack_line_names_the_configs_run_dir() -> None:
    line = plugstack_line(LAYOUT, Path("/run/bootseer"))
    assert line == "required /opt/bootseer/lib/slurm/bootseer.so rundir=/run/bootseer"


def test_per_node_layout_and_hook_wrapper() -> None:
    lay = Layout(prefix=Path("/x/%n/opt"), etc=Path("/x/%n/etc"), unit_dir=None).for_node("n7")
    assert lay.unit is None
    text = hook_wrapper(lay, "epilog").decode()
    assert "export BOOTSEER_CONFIG=/x/n7/etc/config.toml" in text
    assert "export BOOTSEER_PYTHON=/x/n7/opt/venv/bin/python3" in text
    assert text.endswith("exec /x/n7/opt/share/bootseer/epilog/bootseer-epilog\n")


def test_the_unit_says_when_the_agent_is_ready_and_names_its_docs() -> None:
    unit = agent_unit(LAYOUT).decode()
    assert "Type=notify" in unit
    assert "Before=slurmd.service" in unit
    assert "Documentation=file:///opt/bootseer/share/doc/bootseer/image.md" in unit
    assert "ExecStart=/opt/bootseer/venv/bin/bootseer agent" in unit


def test_the_summary_folds_nodes_alike() -> None:
    reports = [
        NodeReport("n1", "unchanged"),
        NodeReport("n3", "failed", error="ssh: timed out"),
        NodeReport("n2", "unchanged"),
    ]
    assert fold(reports) == ["n[1-2]: unchanged", "n3: FAILED: ssh: timed out"]


def test_a_node_that_fails_is_reported_with_its_cause_and_the_others_go_on() -> None:
    def one(name: str) -> NodeReport:
        if name == "n2":
            raise BootseerError("n2: no python3")
        if name == "n3":
            raise OSError(113, "No route to host")
        return NodeReport(name, "installed")

    reports = each(["n1", "n2", "n3", "n4"], 2, one)
    assert [(r.node, r.status) for r in reports] == [
        ("n1", "installed"),
        ("n2", "failed"),
        ("n3", "failed"),
        ("n4", "installed"),
    ]
    assert reports[1].error == "n2: no python3"
    assert "No route to host" in reports[2].error, reports[2]


def test_the_packaged_unit_is_the_one_install_writes() -> None:
    top = Path(__file__).resolve().parents[2]
    assert (top / "packaging" / "bootseer-agent.service").read_bytes() == agent_unit(LAYOUT)


def test_the_metrics_dir_is_set_where_the_config_leaves_it_unset() -> None:
    from bootseer.install.files import parse, with_textfile_dir

    where, d = Path("site.toml"), Path("/var/lib/prometheus/node-exporter")
    bare = b'[paths]\nrun_dir = "/run/bootseer"'  # no newline at the end
    out = with_textfile_dir(bare, where, d)
    cfg = parse(out, where)
    assert cfg.metrics.textfile_dir == d and cfg.paths.run_dir == Path("/run/bootseer")
    assert out.startswith(bare)  # the site's lines stay as they are

    # A [metrics] table of its own gets the key, and keeps its other settings.
    table = b"[metrics]  # for node_exporter\ninterval = 5\n\n[hooks]\nstrict = false\n"
    cfg = parse(with_textfile_dir(table, where, d), where)
    assert (cfg.metrics.textfile_dir, cfg.metrics.interval, cfg.hooks.strict) == (d, 5, False)

    # The config's own choice, or none asked for: the config unchanged.
    own = b'[metrics]\ntextfile_dir = "/srv/textfile"\n'
    assert with_textfile_dir(own, where, d) == own
    assert with_textfile_dir(bare, where, None) == bare


def test_a_metrics_table_that_cannot_take_the_key_is_refused() -> None:
    from bootseer.errors import ConfigError
    from bootseer.install.files import with_textfile_dir

    inline = b"metrics = { interval = 5 }\n"
    with pytest.raises(ConfigError, match="set it there, or --metrics-dir none"):
        with_textfile_dir(inline, Path("site.toml"), Path("/m"))


def test_a_metrics_dir_that_contradicts_the_config_stops_the_install(tmp_path: Path) -> None:
    import subprocess
    import sys

    key = tmp_path / "site.key"
    key.write_text("00" * 32)
    key.chmod(0o600)
    config = tmp_path / "config.toml"
    config.write_text(f'[site]\nkey_file = "{key}"\n\n[metrics]\ntextfile_dir = "/srv/textfile"\n')
    cmd = [sys.executable, "-m", "bootseer.cli", "install", "n1", "--config", str(config)]
    cmd += ["--metrics-dir", "/var/lib/other", "--build-dir", str(tmp_path / "build")]
    r = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0
    assert "sets [metrics] textfile_dir = /srv/textfile, --metrics-dir says" in r.stderr
    assert not (tmp_path / "build").exists()  # before anything was built


def test_what_became_of_each_agent_reads_in_the_summary() -> None:
    from bootseer.agent.handover import Outcome

    assert Outcome("restarted", prefix="/opt/bootseer/venvs/ab").line() == "agent restarted"
    assert Outcome("current").line() == "agent current"
    assert Outcome("pending", (12, 13)).line() == "agent restarts once jobs 12, 13 end"
    assert (
        Outcome("busy", (7,), 2).line() == "agent not restarted: jobs 7 and 2 requests open use it"
    )
    assert Outcome("not_running").line() == "agent not running"
    why = "this agent is from before restarts in place"
    assert Outcome("unsupported", detail=why).line() == f"agent not restarted: {why}"
    report = NodeReport("n1", "installed", ["1 files (config.toml)"], ["agent restarted"])
    assert fold([report]) == ["n1: installed: 1 files (config.toml) (agent restarted)"]


def test_the_documented_metrics_dir_is_where_debians_node_exporter_reads() -> None:
    """Issue 22, item 9: the README's and docs/admin.md's sample [metrics] textfile_dir
    named /var/lib/node_exporter/textfile, where Debian's exporter never looks."""
    import re
    import shutil
    import subprocess

    from bootseer.install.files import DEFAULT_TEXTFILE_DIR

    exporter = shutil.which("prometheus-node-exporter")
    if exporter is not None:  # the installed exporter's own default, as it says
        help_text = subprocess.run([exporter, "--help"], capture_output=True, text=True)
        found = re.search(
            r'--collector\.textfile\.directory="([^"]+)"', help_text.stdout + help_text.stderr
        )
        assert found is not None and Path(found.group(1)) == DEFAULT_TEXTFILE_DIR
    top = Path(__file__).resolve().parents[2]
    for doc in ("README.md", "docs/admin.md"):
        text = (top / doc).read_text()
        dirs = re.findall(r'^textfile_dir = "([^"]+)"', text, re.M)
        assert dirs and all(Path(d) == DEFAULT_TEXTFILE_DIR for d in dirs), (doc, dirs)


def test_the_steps_name_only_the_hosts_this_run_prepared() -> None:
    """Issue 22, item 1: the plugstack line was for "every node and submit host" after an
    install on compute nodes alone; on a submit host without the plugin a ``required``
    line fails every sbatch. Each step now names the hosts this run prepared."""
    from bootseer.install.slurmconf import render

    run_dir = Path("/run/bootseer")
    compute = render(LAYOUT, {}, 90, run_dir, "compared with x", "n[1-4]")
    assert "submit host" not in compute and "every node" not in compute
    assert "plugstack.conf (or a file in plugstack.conf.d/) on n[1-4] alone" in compute
    assert "bootseer install --role client HOSTS" in compute
    assert compute.endswith("bootseer doctor n[1-4]")
    assert "Prolog=/opt/bootseer/libexec/bootseer-prolog" in compute
    client = render(LAYOUT, {}, 90, run_dir, "compared with x", "login1", "client")
    assert "on login1 alone" in client and str(LAYOUT.plugin) in client
    assert "Prolog" not in client and "slurm.conf" not in client  # no hooks there
    nothing = render(LAYOUT, {}, 90, run_dir, "compared with x", "")
    assert "plugstack" not in nothing and "Prolog" not in nothing


def test_a_client_host_gets_the_plugin_cli_and_config_alone(tmp_path: Path) -> None:
    from bootseer.install.bundle import Bundle
    from bootseer.install.files import SiteFiles, node_files

    top = Path(__file__).resolve().parents[2]
    so = tmp_path / "bootseer.so"
    so.write_bytes(b"plugin")
    bundle = Bundle(top, (), {}, so, (3, 11))
    config = b'[site]\nkey_file = "/etc/bootseer/site.key"\n'
    site = SiteFiles(config, b"[store]\n", b"k" * 64)
    compute = {f.path for f in node_files(LAYOUT, bundle, site)}
    client = {f.path for f in node_files(LAYOUT, bundle, site, "client")}
    assert client < compute
    assert LAYOUT.plugin in client and LAYOUT.config in client
    assert {LAYOUT.hook("prolog"), LAYOUT.hook("epilog"), LAYOUT.unit} <= compute - client
    root_only = {Path("/etc/bootseer/site.key"), Path("/etc/bootseer/secrets.toml")}
    assert root_only <= compute and not root_only & client


def test_the_readmes_sample_steps_are_what_install_prints() -> None:
    from bootseer.install.slurmconf import render, with_node_exporter

    text = render(
        LAYOUT,
        {"prologflags": "Contain"},
        90,
        Path("/run/bootseer"),
        "compared with /etc/slurm/slurm.conf",
        "node[001-100]",
    )
    text = with_node_exporter(text, Path("/var/lib/prometheus/node-exporter"))
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert text in readme
