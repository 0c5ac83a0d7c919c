"""``bootseer install NODESET`` over real SSH: Debian's sshd on each node of a slurm-dev
network (its own network namespace, and a mount namespace where the node's root lies
at slurm-dev's NODE_ROOT), reached by name through an OpenSSH client config."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import TEST_PORT_BASE, TEST_STATE

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "slurm-dev"))
from devconfig import NODE_ROOT
from network import Network
from sshd import SSHD, ClusterSsh

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(
        os.geteuid() != 0 or not os.path.exists(SSHD), reason="needs root and openssh-server"
    ),
]

NODES = ("n1", "n2")
PREFIX = NODE_ROOT / "opt" / "bootseer"
ETC = NODE_ROOT / "etc" / "bootseer"
BOOTSEER = [sys.executable, "-c", "import sys; from bootseer.cli import main; sys.exit(main())"]


class Site:
    def __init__(self, state: Path, ssh: ClusterSsh) -> None:
        self.state = state
        self.ssh = ssh
        self.config = state / "admin" / "config.toml"
        self.slurm_conf = state / "admin" / "slurm.conf"
        # The admin machine's own view of NODE_ROOT: there the config names the key and
        # secrets (ETC), as on the nodes. Bound over NODE_ROOT in a mount namespace of the
        # install's own, so that no other checkout's run on this machine shares it.
        self.admin_root = state / "admin-root"

    def install(self, *extra: str, nodes: str = "n[1-2]") -> subprocess.CompletedProcess[str]:
        cmd = [*BOOTSEER, "install", nodes, "--config", str(self.config)]
        cmd += ["--prefix", str(PREFIX), "--etc", str(ETC)]
        cmd += ["--unit-dir", str(NODE_ROOT / "systemd"), "--bin-dir", str(NODE_ROOT / "bin")]
        cmd += ["--ssh-config", str(self.ssh.config), "--slurm-conf", str(self.slurm_conf)]
        cmd += ["--build-dir", str(self.state / "build")]
        # node_exporter's directory (the default, Debian's, lies outside the nodes' own root)
        cmd += ["--metrics-dir", str(NODE_ROOT / "metrics"), *extra]
        bind = 'mount --bind "$0" "$1" && shift && exec "$@"'
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", bind,
               str(self.admin_root), str(NODE_ROOT), *cmd]  # fmt: skip
        return subprocess.run(cmd, capture_output=True, text=True, timeout=600)

    def on(self, node: str, command: str) -> str:
        r = subprocess.run(
            ["ssh", "-F", str(self.ssh.config), node, command],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        return r.stdout


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    state = Path(f"{TEST_STATE}-install")
    shutil.rmtree(state, ignore_errors=True)
    net = Network(TEST_PORT_BASE + 100, NODES, node_mbit=10_000, store_mbit=1_000)
    ssh = ClusterSsh(state, net)
    admin = state / "admin"
    admin.mkdir(parents=True)
    etc = state / "admin-root" / ETC.relative_to(NODE_ROOT)
    etc.mkdir(parents=True)
    key = etc / "site.key"
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32).hex().encode())
    os.close(fd)
    fd = os.open(etc / "secrets.toml", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b'[store]\naccess_key = "admin"\nsecret_key = "not-for-users"\n')
    os.close(fd)
    (admin / "config.toml").write_text(
        f'[site]\nkey_file = "{ETC}/site.key"\n\n'
        f'[store]\nuri = "file://{state}/store"\nsecrets_file = "{ETC}/secrets.toml"\n\n'
        f'[paths]\nrun_dir = "{NODE_ROOT}/run"\n'
    )
    (admin / "slurm.conf").write_text("PrologFlags=Contain\nPrologEpilogTimeout=60\n")
    try:
        for node in NODES:
            net.node_up(node)
        ssh.up()
        yield Site(state, ssh)
    finally:
        ssh.down()
        net.down()
        shutil.rmtree(state, ignore_errors=True)


def test_install_then_again_then_a_changed_config(site: Site) -> None:
    # --dry-run: what would change, and nothing written.
    r = site.install("--dry-run")
    assert r.returncode == 0, r.stderr
    assert "n[1-2]: would change:" in r.stdout, r.stdout
    for node in NODES:
        assert list(site.ssh.node_root(node).iterdir()) == [], node

    # A directory the site already has keeps its mode (Debian's /usr/local/bin: 2775).
    site.on("n1", f"mkdir {NODE_ROOT}/bin && chmod 2775 {NODE_ROOT}/bin")
    r = site.install()
    assert r.returncode == 0, r.stderr + r.stdout
    assert "n[1-2]: installed:" in r.stdout, r.stdout
    assert site.on("n1", f"stat -c %a {NODE_ROOT}/bin").strip() == "2775"
    # The lines to add, as additions: the site's Contain stays.
    assert f"Prolog={PREFIX}/libexec/bootseer-prolog" in r.stdout
    assert f"Epilog={PREFIX}/libexec/bootseer-epilog" in r.stdout
    assert "PrologFlags=Contain,Alloc" in r.stdout
    assert "PrologEpilogTimeout=110" in r.stdout  # the default 90 s deadline and room
    assert f"required {PREFIX}/lib/slurm/bootseer.so rundir={NODE_ROOT}/run" in r.stdout
    assert f"--collector.textfile.directory={NODE_ROOT}/metrics" in r.stdout

    # Each node's venv runs on the node's own /usr/bin/python3 (Debian's 3.11.2 here),
    # for an ordinary user, from the node's own root.
    want = subprocess.run(
        ["/usr/bin/python3", "-c", "import sys; print(sys.version)"], capture_output=True, text=True
    ).stdout
    check = "import sys, bootseer.deps.archive; print(sys.version)"
    nobody = "setpriv --reuid=nobody --regid=nogroup --clear-groups"
    for node in NODES:
        assert site.on(node, f"{nobody} {PREFIX}/venv/bin/python3 -c '{check}'") == want
        assert site.on(node, f"{nobody} {NODE_ROOT}/bin/bootseer --help").startswith("usage:")
        modes = site.on(
            node, f"stat -c '%a %U %n' {ETC}/config.toml {ETC}/secrets.toml {ETC}/site.key"
        ).split("\n")
        assert modes[:3] == [
            f"644 root {ETC}/config.toml",
            f"600 root {ETC}/secrets.toml",
            f"600 root {ETC}/site.key",
        ]
        unit = site.on(node, f"cat {NODE_ROOT}/systemd/bootseer-agent.service")
        assert "Type=notify" in unit
        assert f"ExecStart={PREFIX}/venv/bin/bootseer agent" in unit
        for doc in unit.split("Documentation=")[1].split("\n")[0].split():
            site.on(node, f"test -f {doc.removeprefix('file://')}")
        # The config leaves [metrics] textfile_dir unset: the nodes' copy names
        # --metrics-dir, made root's for node_exporter to read.
        config = site.on(node, f"cat {ETC}/config.toml")
        assert f'textfile_dir = "{NODE_ROOT}/metrics"' in config
        assert site.on(node, f"stat -c '%a %U' {NODE_ROOT}/metrics") == "755 root\n"
        wrapper = site.on(node, f"cat {PREFIX}/libexec/bootseer-prolog")
        assert f"export BOOTSEER_CONFIG={ETC}/config.toml" in wrapper
    # What lies behind each node's root is its own: n1's is not n2's.
    assert (site.ssh.node_root("n1") / "opt").is_dir()
    assert (site.ssh.node_root("n2") / "opt").is_dir()

    r = site.install()
    assert r.returncode == 0, r.stderr
    assert "n[1-2]: unchanged" in r.stdout, r.stdout

    # A venv cut off before it was complete is never used: it is built again.
    site.on("n2", f"rm {PREFIX}/venv/.complete")
    r = site.install()
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [x for x in lines if x.startswith("n1: unchanged")], r.stdout
    assert [x for x in lines if x.startswith("n2: installed: venv ") and "(0 wheels copied)" in x]
    site.on("n2", f"test -f {PREFIX}/venv/.complete")

    # A changed config reaches every node alone: the venv stays.
    with site.config.open("a") as f:
        f.write("\n[hooks]\nprolog_deadline = 100\n")
    r = site.install()
    assert r.returncode == 0, r.stderr
    assert "n[1-2]: installed: 1 files (config.toml)" in r.stdout, r.stdout
    assert "PrologEpilogTimeout=120" in r.stdout

    # A node without the Python asked for is refused before anything is written.
    before = site.on("n1", f"ls -l --time-style=+%s.%N {PREFIX}")
    r = site.install("--python", "/nonexistent/python3")
    assert r.returncode == 1
    assert "n[1-2]: FAILED: no /nonexistent/python3 there" in r.stdout, r.stdout
    assert site.on("n1", f"ls -l --time-style=+%s.%N {PREFIX}") == before


def test_a_command_that_fills_stderr_does_not_stall(site: Site) -> None:
    from bootseer.install.remote import Node

    with Node("n1", site.ssh.config) as node:
        r = node.sh("head -c 5000000 /dev/zero >&2; echo done", timeout=30)
    assert (r.status, r.out, len(r.err)) == (0, "done\n", 5_000_000)


def test_a_path_root_runs_from_that_a_user_can_write_is_refused(site: Site) -> None:
    """n1's prefix would sit in a directory every user can write (she renames root's
    install away and puts her own hooks there); on n2, in a sticky one, mallory made the
    prefix first (``mkdir -p`` kept it: the install went into her directory). Then a
    ``--python`` reached through a directory of hers. Each node is refused before
    anything is written; before, each install went ahead."""
    import pwd

    mallory = pwd.getpwnam("mallory")
    roots = {node: site.ssh.node_root(node) for node in NODES}
    prefix = NODE_ROOT / "srv" / "bootseer"
    try:
        (roots["n1"] / "srv").mkdir()
        (roots["n1"] / "srv").chmod(0o777)
        (roots["n2"] / "srv").mkdir()
        (roots["n2"] / "srv").chmod(0o1777)
        hers = roots["n2"] / "srv" / "bootseer"
        hers.mkdir()
        os.chown(hers, mallory.pw_uid, mallory.pw_gid)
        r = site.install("--prefix", str(prefix))
        assert r.returncode == 1, r.stdout
        lines = r.stdout.splitlines()
        assert [
            x
            for x in lines
            if x.startswith("n1: FAILED: ")
            and f"{prefix.parent} is writable by every user (mode 0777)" in x
        ], r.stdout
        assert [
            x
            for x in lines
            if x.startswith("n2: FAILED: ") and f"{prefix} is owned by uid {mallory.pw_uid}" in x
        ], r.stdout
        assert list((roots["n1"] / "srv").iterdir()) == []
        assert list(hers.iterdir()) == []

        # The interpreter root's hooks run, through a directory of mallory's.
        for root in roots.values():
            py = root / "home" / "mallory-py"
            py.mkdir(parents=True)
            (py / "python3").symlink_to("/usr/bin/python3")
            os.chown(py, mallory.pw_uid, mallory.pw_gid)
        python = NODE_ROOT / "home" / "mallory-py" / "python3"
        r = site.install("--python", str(python))
        assert r.returncode == 1, r.stdout
        assert f"n[1-2]: FAILED: {python.parent} is owned by uid {mallory.pw_uid}" in r.stdout
    finally:
        for root in roots.values():
            shutil.rmtree(root / "srv", ignore_errors=True)
            shutil.rmtree(root / "home", ignore_errors=True)


def test_a_client_host_gets_the_plugin_and_cli_and_the_steps_name_it_alone(site: Site) -> None:
    """Issue 22, item 1: submit and login hosts (here n2) get the plugin, the CLI and the
    config, no agent, no hooks, no root-only files; each install's next steps name the
    hosts it prepared alone (before: the plugstack line for "every node and submit host"
    after an install on the compute nodes, which broke every sbatch on a submit host)."""
    for root in (site.ssh.node_root(n) for n in NODES):  # hosts as fresh as a new cluster's
        for entry in root.iterdir():
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    r = site.install("--role", "client", nodes="n2")
    assert r.returncode == 0, r.stderr + r.stdout
    assert "n2: installed:" in r.stdout, r.stdout
    out = r.stdout.split("\n\n", 1)[1]
    assert "on n2 alone" in out and f"required {PREFIX}/lib/slurm/bootseer.so" in out
    assert "slurm.conf" not in out and "Prolog" not in out and "n1" not in out
    nobody = "setpriv --reuid=nobody --regid=nogroup --clear-groups"
    assert site.on("n2", f"{nobody} {NODE_ROOT}/bin/bootseer --help").startswith("usage:")
    site.on("n2", f"test -f {PREFIX}/lib/slurm/bootseer.so && test -f {ETC}/config.toml")
    absent = [
        f"{PREFIX}/libexec",
        f"{NODE_ROOT}/systemd/bootseer-agent.service",
        f"{ETC}/site.key",
        f"{ETC}/secrets.toml",
        f"{NODE_ROOT}/metrics",
    ]
    assert site.on("n2", f"ls -d {' '.join(absent)} 2>/dev/null || true") == ""
    again = site.install("--role", "client", nodes="n2")
    assert "n2: unchanged" in again.stdout, again.stdout

    r = site.install(nodes="n1")  # the compute role
    assert r.returncode == 0, r.stderr + r.stdout
    out = r.stdout.split("\n\n", 1)[1]
    assert "on n1 alone" in out and "n2" not in out and "submit host" not in out
    assert f"Prolog={PREFIX}/libexec/bootseer-prolog" in out
    assert "bootseer install --role client HOSTS" in out
    assert out.rstrip().endswith("bootseer doctor n1")


def test_a_compute_node_without_fuse3_is_refused_before_anything_is_written(site: Site) -> None:
    """Issue 22, item 3: the installer checked python3 but not fuse3, which doctor found
    later. n1's Python here runs where /usr/bin/fusermount3 is hidden (a mount namespace
    of its own, as if fuse3 were not installed): the install stops at its first look."""
    wrapper = site.ssh.node_root("n1") / "nofuse" / "python3"
    wrapper.parent.mkdir()
    wrapper.write_text(
        "#!/bin/sh\n"
        "exec unshare --mount --propagation private sh -c "
        '\'mount --bind /dev/null /usr/bin/fusermount3 && exec /usr/bin/python3 "$@"\' - "$@"\n'
    )
    wrapper.chmod(0o755)
    try:
        before = site.on("n1", f"ls -A {NODE_ROOT}")
        r = site.install("--python", str(NODE_ROOT / "nofuse" / "python3"), nodes="n1")
        assert r.returncode == 1, r.stdout
        assert "n1: FAILED: no fusermount3 there (the agent serves images over FUSE): " in r.stdout
        assert "apt-get install fuse3" in r.stdout
        assert site.on("n1", f"ls -A {NODE_ROOT}") == before
    finally:
        shutil.rmtree(wrapper.parent)


def test_proxyjump_in_the_ssh_config_is_followed(site: Site, tmp_path: Path) -> None:
    """Issue 22, item 5: ``ssh`` and ``doctor --rsh`` reached a node through a jump host,
    ``install`` went straight to the name and failed. Here n2 is named through n1: its
    sshd sees the connection come from n1's address, not this machine's."""
    from bootseer.install.remote import Node, RemoteError

    n1_ip, n2_ip = site.ssh.net.node_ip("n1"), site.ssh.net.node_ip("n2")
    config = tmp_path / "ssh_config"
    config.write_text(
        "Host n2-behind-n1 n2-loop\n"
        f"    HostName {n2_ip}\n"
        "    User root\n"
        f"    IdentityFile {site.ssh.key}\n"
        f"    UserKnownHostsFile {site.ssh.known_hosts}\n"
        "Host n2-behind-n1\n"
        "    ProxyJump n1\n"
        "Host n2-loop\n"
        "    ProxyJump n2-loop\n\n" + site.ssh.config.read_text()
    )
    with Node("n2-behind-n1", config) as node:
        came_from = node.sh("echo $SSH_CONNECTION").out.split()
    assert came_from[0] == n1_ip and came_from[2] == n2_ip, came_from
    with Node("n2", site.ssh.config) as node:  # without the jump: from this machine
        assert node.sh("echo $SSH_CONNECTION").out.split()[0] != n1_ip
    with pytest.raises(RemoteError, match="ProxyJump hops"):
        Node("n2-loop", config)


def _probe_wheel(wheels: Path) -> Path:
    """A wheel nothing installs: with it, the bundle is another version (its venv)."""
    import zipfile

    whl = wheels / "zz_rollback_probe-1.0-py3-none-any.whl"
    info = "zz_rollback_probe-1.0.dist-info"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr(
            f"{info}/METADATA", "Metadata-Version: 2.1\nName: zz-rollback-probe\nVersion: 1.0\n"
        )
        z.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        z.writestr(f"{info}/RECORD", "")
    return whl


def test_rollback_returns_every_role_to_the_version_before(site: Site) -> None:
    """Issue 22, item 7: no way back from an upgrade. ``install --rollback`` returns a
    compute node (n1) and a client host (n2) to the version installed before (its venv
    and files, kept there), and the one they ran becomes the previous: a second rollback
    goes forward again. Before, the option did not exist."""
    for args in ((), ("--role", "client")):  # version A (as the tests before left them)
        r = site.install(*args, nodes="n1" if not args else "n2")
        assert r.returncode == 0, r.stderr + r.stdout
    before = {n: site.on(n, f"readlink {PREFIX}/venv").strip() for n in NODES}
    probe = _probe_wheel(site.state / "build" / "wheels")
    try:  # version B: another venv
        for args in ((), ("--role", "client")):
            r = site.install(*args, nodes="n1" if not args else "n2")
            assert r.returncode == 0 and ": installed: venv " in r.stdout, r.stderr + r.stdout
    finally:
        probe.unlink()
    after = {n: site.on(n, f"readlink {PREFIX}/venv").strip() for n in NODES}
    assert all(after[n] != before[n] for n in NODES), (before, after)

    def rollback(*extra: str) -> subprocess.CompletedProcess[str]:
        return site.install("--rollback", *extra)

    r = rollback("--dry-run")
    assert r.returncode == 0 and "n[1-2]: would change: venv " in r.stdout, r.stdout
    assert {n: site.on(n, f"readlink {PREFIX}/venv").strip() for n in NODES} == after
    r = rollback()
    assert r.returncode == 0, r.stderr + r.stdout
    a = before["n1"].rsplit("/", 1)[-1]
    assert f"n[1-2]: rolled back: venv {a}" in r.stdout, r.stdout
    nobody = "setpriv --reuid=nobody --regid=nogroup --clear-groups"
    for n in NODES:
        assert site.on(n, f"readlink {PREFIX}/venv").strip() == before[n]
        assert site.on(n, f"{nobody} {NODE_ROOT}/bin/bootseer --help").startswith("usage:")
    # Version A is what the checkout builds: the nodes have it, whole.
    r = site.install(nodes="n1")
    assert "n1: unchanged" in r.stdout, r.stdout
    # Forward again, and back: the version each ran is the previous.
    r = rollback()
    assert f"n[1-2]: rolled back: venv {after['n1'].rsplit('/', 1)[-1]}" in r.stdout, r.stdout
    r = rollback()
    assert f"n[1-2]: rolled back: venv {a}" in r.stdout, r.stdout
    # A node with no previous version kept says so, and nothing changes there.
    site.on("n2", f"rm -r {PREFIX}/previous")
    r = rollback()
    assert r.returncode == 1, r.stdout
    assert "n2: FAILED: no previous version kept here" in r.stdout, r.stdout
    assert site.on("n2", f"readlink {PREFIX}/venv").strip() == before["n2"]


def test_the_debian_package_is_pushed_with_the_sites_files(site: Site, tmp_path: Path) -> None:
    """Issue 22, item 4: ``install --deb FILE`` pushes the one artifact. These nodes share
    this machine's root and dpkg, so the package is never installed here (test_fresh_root
    does that): a dry run reads its version, finds each node's dpkg without it and the
    site's files to write, and changes nothing."""
    from bootseer.install import debpkg
    from bootseer.install.bundle import Bundle, checkout

    top = checkout()
    subprocess.run(["make", "-s", "-C", str(top / "spank"), "bootseer.so"], check=True)
    debpkg.stage(tmp_path / "root", Bundle(top, (), {}, top / "spank" / "bootseer.so", (3, 11)))
    version = "0.1.0+202611270000.abcdef12"
    deb = tmp_path / debpkg.deb_name(version)
    debpkg.pack(tmp_path / "root", version, deb, compression="none")
    # One command for both roles (issue 22's install count): n1 compute, n2 a submit host.
    cmd = [*BOOTSEER, "install", "n1", "--client", "n2", "--deb", str(deb)]
    cmd += ["--config", str(site.config)]
    cmd += ["--ssh-config", str(site.ssh.config), "--slurm-conf", str(site.slurm_conf)]
    cmd += ["--metrics-dir", "none", "--dry-run"]
    bind = 'mount --bind "$0" "$1" && shift && exec "$@"'
    wrap = ["unshare", "--mount", "--propagation", "private", "sh", "-c", bind]
    wrap += [str(site.admin_root), str(NODE_ROOT)]
    r = subprocess.run([*wrap, *cmd], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr + r.stdout
    # Each node: the package, and the config at the package's /etc/bootseer (the key and
    # secrets where this site's config names them: n1 may have them from the tests before).
    for node in NODES:
        line = [x for x in r.stdout.splitlines() if x.startswith(f"{node}: ") or "n[1-2]" in x]
        assert line and f"would change: package {version}, " in line[0], r.stdout
        assert "config.toml" in line[0], r.stdout
    assert not Path("/opt/bootseer/venvs/abcdef12").exists()
    steps = r.stdout.split("\n\n", 1)[1]
    compute, client = steps.split("The package wrote the plugstack line on n2 ")
    assert "Prolog=/opt/bootseer/libexec/bootseer-prolog" in compute and "n2" not in compute
    assert "The package wrote the plugstack line on n1 " in compute, steps
    assert "Prolog" not in client and "No agent, hooks or slurmd there" in client, steps
    r = subprocess.run([*wrap, *cmd, "--prefix", str(PREFIX)], capture_output=True, text=True)
    assert r.returncode != 0 and "--deb installs in the package's /opt/bootseer" in r.stderr


def test_uninstall_waits_for_slurm_to_let_go_then_removes_everything(site: Site) -> None:
    """Issue 22, item 7: no command removed bootseer (six order-sensitive commands by hand).
    ``bootseer uninstall`` refuses while a node's Slurm configuration still names the
    plugin (every sbatch would fail) or the hooks (every prolog), then removes the agent's
    unit, the hooks, the plugin, the venvs, the docs, the config, key, secrets and link."""
    r = site.install()
    assert r.returncode == 0, r.stderr + r.stdout
    slurm_etc = NODE_ROOT / "etc" / "slurm"
    for node in NODES:  # each node's own Slurm files, as a site that followed the steps
        d = site.ssh.node_root(node) / slurm_etc.relative_to(NODE_ROOT)
        d.mkdir(parents=True, exist_ok=True)
        (d / "plugstack.conf").write_text(
            f"# required {PREFIX}/lib/slurm/bootseer.so (an old comment)\n"
            f"required {PREFIX}/lib/slurm/bootseer.so rundir={NODE_ROOT}/run\n"
        )
        (d / "slurm.conf").write_text(f"Prolog={PREFIX}/libexec/bootseer-prolog\n")

    def uninstall(*extra: str) -> subprocess.CompletedProcess[str]:
        cmd = [*BOOTSEER, "uninstall", "n[1-2]", "--config", str(site.config)]
        cmd += ["--prefix", str(PREFIX), "--etc", str(ETC), "--slurm-etc", str(slurm_etc)]
        cmd += ["--unit-dir", str(NODE_ROOT / "systemd"), "--bin-dir", str(NODE_ROOT / "bin")]
        cmd += ["--ssh-config", str(site.ssh.config), *extra]
        bind = 'mount --bind "$0" "$1" && shift && exec "$@"'
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", bind,
               str(site.state / "admin-root"), str(NODE_ROOT), *cmd]  # fmt: skip
        return subprocess.run(cmd, capture_output=True, text=True, timeout=600)

    r = uninstall()
    assert r.returncode == 1
    assert "n[1-2]: FAILED: Slurm still runs bootseer here: " in r.stdout, r.stdout
    assert "plugstack.conf:2:" in r.stdout and "nothing was removed" in r.stdout
    site.on("n1", f"test -x {PREFIX}/venv/bin/bootseer && test -f {ETC}/site.key")
    for node in NODES:  # the plugstack line first, then the hooks
        d = site.ssh.node_root(node) / slurm_etc.relative_to(NODE_ROOT)
        (d / "plugstack.conf").write_text("")
    r = uninstall()
    assert r.returncode == 1 and "slurm.conf:1:Prolog=" in r.stdout, r.stdout
    for node in NODES:
        d = site.ssh.node_root(node) / slurm_etc.relative_to(NODE_ROOT)
        (d / "slurm.conf").write_text("Prolog=/etc/slurm/site-prolog\n")
    r = uninstall("--dry-run")
    assert r.returncode == 0 and "n[1-2]: would change: " in r.stdout, r.stdout
    site.on("n1", f"test -x {PREFIX}/venv/bin/bootseer")
    r = uninstall()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "n[1-2]: removed: " in r.stdout, r.stdout
    for node in NODES:
        left = site.on(
            node,
            f"ls -d {PREFIX} {ETC} {NODE_ROOT}/bin/bootseer "
            f"{NODE_ROOT}/systemd/bootseer-agent.service 2>/dev/null || true",
        )
        assert left == "", (node, left)
    assert "n[1-2]: unchanged" in uninstall().stdout  # again: nothing of bootseer there
