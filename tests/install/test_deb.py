"""Issue 22, item 4: one artifact, ``bootseer_<version>_amd64.deb``. The suite checks what
the package holds, built with the real ``dpkg-deb`` from this checkout's files (all but
the venv, whose build takes a minute: ``tests/install/test_fresh_root.py`` builds the
whole package and installs it into a fresh bookworm root per host role)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer.install import debpkg
from bootseer.install.bundle import Bundle, checkout
from bootseer.install.files import agent_unit

pytestmark = pytest.mark.skipif(
    not shutil.which("dpkg-deb") or not shutil.which("make"), reason="needs dpkg-deb and make"
)


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    top = checkout()
    r = subprocess.run(["make", "-s", "-C", str(top / "spank"), "bootseer.so"], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"the SPANK plugin does not build here: {r.stderr.decode()[-300:]}")
    bundle = Bundle(top, (), {}, top / "spank" / "bootseer.so", sys.version_info[:2])
    tmp = tmp_path_factory.mktemp("deb")
    root = tmp / "root"
    debpkg.stage(root, bundle)
    out = tmp / debpkg.deb_name("0.1.0+202611270000.abcdef12")
    debpkg.pack(root, "0.1.0+202611270000.abcdef12", out, compression="none")
    return out


def listing(deb: Path) -> dict[str, str]:
    """Each path in the package -> its mode, owner and link target as dpkg-deb lists them."""
    out = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True)
    entries = {}
    for line in out.stdout.splitlines():
        mode, owner, _size, _date, _time, path, *link = line.split()
        entries[path.removeprefix(".")] = " ".join([mode, owner, *link])
    return entries


def test_the_package_holds_every_part_a_node_needs_owned_by_root(deb: Path) -> None:
    have = listing(deb)
    lay = debpkg.LAYOUT
    want = {
        str(lay.plugin): "-rwxr-xr-x root/root",
        str(lay.hook("prolog")): "-rwxr-xr-x root/root",
        str(lay.hook("epilog")): "-rwxr-xr-x root/root",
        str(lay.hook_script("prolog")): "-rwxr-xr-x root/root",
        str(lay.docs / "admin.md"): "-rw-r--r-- root/root",
        "/lib/systemd/system/bootseer-agent.service": "-rw-r--r-- root/root",
        "/usr/bin/bootseer": f"lrwxrwxrwx root/root -> {lay.bootseer}",
    }
    for path, what in want.items():
        assert have.get(path) == what, (path, have.get(path))
    assert have["/opt/bootseer/venv"].endswith(
        "-> venvs/" + Bundle(Path(), (), {}, Path(), (3, 11)).wheels_digest
    )
    assert all(v.split()[1] == "root/root" for v in have.values())
    # Never the site's files: the config, the site key, the store secrets.
    assert not [p for p in have if p.startswith("/etc/")], have


def test_the_packaged_unit_is_the_hardened_one_with_the_packages_paths(
    deb: Path, tmp_path: Path
) -> None:
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True)
    unit = tmp_path / "lib/systemd/system/bootseer-agent.service"
    assert unit.read_bytes() == agent_unit(debpkg.LAYOUT)
    assert "ExecReload=/opt/bootseer/venv/bin/bootseer agent --restart --force" in unit.read_text()


def test_control_names_debians_python_and_fuse_and_the_scripts_parse(
    deb: Path, tmp_path: Path
) -> None:
    fields = subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Package", "Version", "Architecture", "Depends"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "Package: bootseer\n" in fields and "Architecture: amd64\n" in fields
    assert "python3 (>= 3.11), python3 (<< 3.12), fuse3, libfuse3-3, tzdata" in fields
    subprocess.run(["dpkg-deb", "-e", str(deb), str(tmp_path / "DEBIAN")], check=True)
    for script in ("preinst", "postinst", "prerm", "postrm"):
        path = tmp_path / "DEBIAN" / script
        assert path.stat().st_mode & 0o111, script
        assert subprocess.run(["sh", "-n", str(path)]).returncode == 0, script
    # An upgrade keeps the venv a running agent uses; the agent is reloaded, not restarted.
    post = (tmp_path / "DEBIAN" / "postinst").read_text()
    assert "systemctl reload bootseer-agent.service" in post
    assert "cp -al" in (tmp_path / "DEBIAN" / "preinst").read_text()


PLUGSTACK_CASES = {
    # plugstack.conf.d's files before -> bootseer.conf after postinst
    "none": ({}, True),
    "a line of the site's in plugstack.conf.d": ({"site.conf": "required /x/bootseer.so\n"}, False),
    "another plugin only": ({"pyxis.conf": "required /usr/lib/pyxis/spank_pyxis.so\n"}, True),
    "a commented-out line": ({"old.conf": "# required /x/bootseer.so\n"}, True),
}


@pytest.mark.root
@pytest.mark.parametrize("case", list(PLUGSTACK_CASES))
def test_postinst_writes_the_plugstack_line_once_and_prerm_removes_it_first(
    deb: Path, tmp_path: Path, case: str
) -> None:
    """Issue 22: the package brings its plugstack line where Debian's plugstack.conf
    includes plugstack.conf.d/ and no line names the plugin yet (a second would fail
    every sbatch); ``prerm remove`` takes it out before dpkg removes the plugin, and
    leaves a line of the site's. Run in a mount namespace of its own, over tmpfs on
    /etc/slurm and /opt/bootseer."""
    files, written = PLUGSTACK_CASES[case]
    subprocess.run(["dpkg-deb", "-e", str(deb), str(tmp_path / "DEBIAN")], check=True)
    d = tmp_path / "DEBIAN"
    script = f"""
set -e
mount -t tmpfs t /etc/slurm && mount -t tmpfs t /opt/bootseer
[ ! -d /etc/systemd/system ] || mount -t tmpfs t /etc/systemd/system  # systemctl enable
mkdir -p /etc/slurm/plugstack.conf.d /opt/bootseer/venvs/v1
echo 'include /etc/slurm/plugstack.conf.d/*.conf' > /etc/slurm/plugstack.conf
ln -s venvs/v1 /opt/bootseer/venv
for f in {" ".join(files)}; do cp "{tmp_path}/$f" /etc/slurm/plugstack.conf.d/; done
PATH=/usr/sbin:/usr/bin:/sbin:/bin sh {d}/postinst configure
cat /etc/slurm/plugstack.conf.d/bootseer.conf 2>/dev/null || echo NONE
echo ---
sh {d}/prerm upgrade && ls /etc/slurm/plugstack.conf.d
echo ---
sh {d}/prerm remove && ls /etc/slurm/plugstack.conf.d
"""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    if not Path("/opt/bootseer").is_dir() or not Path("/etc/slurm").is_dir():
        pytest.skip("needs /etc/slurm and /opt/bootseer to mount over")
    r = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    after_post, after_upgrade, after_remove = r.stdout.split("---\n")
    if written:
        assert after_post.splitlines()[1:] == [
            "required /opt/bootseer/lib/slurm/bootseer.so rundir=/run/bootseer"
        ], after_post
        assert "bootseer.conf" in after_upgrade.split()  # an upgrade keeps it
    else:
        assert after_post == "NONE\n", after_post
    assert "bootseer.conf" not in after_remove.split()
    assert sorted(after_remove.split()) == sorted(files)  # the site's own stay
