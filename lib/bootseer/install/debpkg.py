"""bootseer as one Debian package: ``bootseer_<version>_amd64.deb``, built with ``dpkg-deb``.

For sites that provision nodes from an image (Warewulf, xCAT, Bright) and never install
over SSH: ``apt install ./bootseer_<version>_amd64.deb`` into the image, or on a running
host; ``bootseer install --deb FILE NODESET`` pushes the same file over SSH, with the
site's config and root-only files (never in the package).

What it holds is what :mod:`bootseer.install.node` puts on a node, in the default layout:

- ``/opt/bootseer/venvs/<digest>``: the venv, built here from the bundle's wheels on
  Debian's ``/usr/bin/python3`` at its final path (in a mount namespace of the build's
  own, where ``/opt/bootseer`` is the package's tree), and the ``venv`` link to it;
- the SPANK plugin, the hooks and their wrappers, the docs (:func:`files.version_files`);
- the agent's unit in ``/lib/systemd/system`` (an install's ``/etc/systemd/system``
  one takes precedence), and ``/usr/bin/bootseer`` for jobs' ``PATH``.

Its maintainer scripts keep one old venv at most: ``preinst`` keeps a hard-linked copy
of the venv a running agent may still use, ``postinst`` puts it back under its name
(dpkg removed it), drops every other, and asks a running agent to restart in place
(``systemctl reload``: once no job uses it); a stopped one starts where the site
config is there. Removal stops and disables the agent first.

    >>> deb_name("0.1.0+202611270430.83eea169")
    'bootseer_0.1.0+202611270430.83eea169_amd64.deb'
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import bootseer
from bootseer.install.bundle import BuildError, Bundle, build
from bootseer.install.files import version_files
from bootseer.install.layout import Layout

PACKAGE = "bootseer"
LAYOUT = Layout(unit_dir=Path("/lib/systemd/system"), bin_dir=None)
BIN_LINK = Path("/usr/bin/bootseer")
PYTHON = "/usr/bin/python3"  # Debian's, which the package depends on
DEPENDS = (
    "python3 (>= 3.11), python3 (<< 3.12), fuse3, libfuse3-3, tzdata"  # tzdata: report's times
)
RECOMMENDS = "squashfuse, squashfs-tools"

PREINST = r"""#!/bin/sh
# bootseer: keep the venv a running agent may still use (dpkg removes the old files).
set -e
p=/opt/bootseer
# (an upgrade, or a first install over an SSH install's venv)
if old=$(readlink "$p/venv" 2>/dev/null) && [ -d "$p/$old" ]; then
  rm -rf "$p/venvs/.kept"
  cp -al "$p/$old" "$p/venvs/.kept"
  echo "$old" > "$p/venvs/.kept-name"
fi
exit 0
"""

POSTINST = r"""#!/bin/sh
# bootseer: one old venv at most; the plugstack line; the agent enabled, reloaded (restart
# in place) or started.
set -e
p=/opt/bootseer
MARK="# bootseer's package: removed with it (apt remove bootseer)"
if [ "$1" = configure ]; then
  new=$(readlink "$p/venv")
  keep="$(basename "$new")"
  if [ -f "$p/venvs/.kept-name" ]; then
    old=$(cat "$p/venvs/.kept-name")
    if [ "$old" != "$new" ] && [ ! -e "$p/$old" ]; then mv -T "$p/venvs/.kept" "$p/$old"; fi
    keep="$keep $(basename "$old")"
    rm -rf "$p/venvs/.kept" "$p/venvs/.kept-name"
  fi
  for v in "$p"/venvs/*; do
    case " $keep " in *" $(basename "$v") "*) ;; *) rm -rf "$v" ;; esac
  done
  touch "$p/$new/.complete"
  # The plugstack line, where Debian's plugstack.conf includes plugstack.conf.d/ and no
  # file there names the plugin yet (a second line for it would fail every sbatch).
  d=/etc/slurm/plugstack.conf.d
  if [ -d "$d" ] && ! grep -qs "^[^#]*bootseer\.so" /etc/slurm/plugstack.conf "$d"/*.conf; then
    printf '%s\n%s\n' "$MARK" "required $p/lib/slurm/bootseer.so rundir=/run/bootseer" \
      > "$d/bootseer.conf.new" && mv "$d/bootseer.conf.new" "$d/bootseer.conf"
  fi
  if [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    systemctl enable bootseer-agent.service >/dev/null 2>&1 || true
    if systemctl is-active --quiet bootseer-agent.service; then
      systemctl reload bootseer-agent.service || true
    elif [ -f /etc/bootseer/config.toml ]; then
      systemctl start bootseer-agent.service || true
    fi
  else
    systemctl enable bootseer-agent.service >/dev/null 2>&1 || true  # an image's root
  fi
fi
exit 0
"""

PRERM = r"""#!/bin/sh
# bootseer: first the plugstack line the package wrote (a `required` line naming a
# missing plugin fails every sbatch), then the agent.
set -e
MARK="# bootseer's package: removed with it (apt remove bootseer)"
f=/etc/slurm/plugstack.conf.d/bootseer.conf
if [ "$1" = remove ]; then
  if [ "$(head -n 1 "$f" 2>/dev/null)" = "$MARK" ]; then rm -f "$f"; fi
  if [ -d /run/systemd/system ]; then
    systemctl disable --now bootseer-agent.service >/dev/null 2>&1 || true
  fi
fi
exit 0
"""

POSTRM = r"""#!/bin/sh
set -e
if [ "$1" = remove ] || [ "$1" = purge ]; then
  rm -rf /opt/bootseer/venvs /opt/bootseer/previous /opt/bootseer/install.json
  rmdir /opt/bootseer 2>/dev/null || true
  [ ! -d /run/systemd/system ] || systemctl daemon-reload
fi
exit 0
"""


def deb_name(version: str) -> str:
    return f"{PACKAGE}_{version}_amd64.deb"


def deb_version(bundle: Bundle, now: float | None = None) -> str:
    """``<bootseer's version>+<UTC build minute>.<venv digest>``: a later build sorts
    later (apt takes it as an upgrade), and the name says which venv it holds."""
    stamp = time.strftime("%Y%m%d%H%M", time.gmtime(now))
    return f"{bootseer.__version__}+{stamp}.{bundle.wheels_digest[:8]}"


def build_deb(
    build_dir: Path,
    out_dir: Path,
    log: Callable[[str], None] = lambda _: None,
    compression: str = "zstd",
    version: str | None = None,
    more_versions: Sequence[str] = (),
) -> Path:
    """Build the package into ``out_dir``; returns its path. ``version``: instead of
    :func:`deb_version`'s (a site's own numbering); ``more_versions``: the same package
    under these versions too, beside it (a test's upgrade, without a second build)."""
    bundle = build(build_dir, log)
    version = version or deb_version(bundle)
    root = build_dir / "deb-root"
    shutil.rmtree(root, ignore_errors=True)
    stage(root, bundle)
    venv = LAYOUT.venvs / bundle.wheels_digest
    log(f"building the venv {venv} on {PYTHON} from {len(bundle.wheels)} wheels")
    _venv_at_its_path(root / LAYOUT.prefix.relative_to("/"), venv, build_dir / "wheels")
    out_dir.mkdir(parents=True, exist_ok=True)
    deb = out_dir / deb_name(version)
    log(f"dpkg-deb --build ({compression}) {deb}")
    pack(root, version, deb, compression)
    for more in more_versions:
        pack(root, more, out_dir / deb_name(more), compression)
    shutil.rmtree(root, ignore_errors=True)
    return deb


def stage(root: Path, bundle: Bundle) -> None:
    """The package's tree in ``root`` but the venv itself: the files of this version,
    the ``venv`` link, ``/usr/bin/bootseer``, the maintainer scripts."""
    tree = root / LAYOUT.prefix.relative_to("/")
    tree.mkdir(parents=True)
    (tree / "venv").symlink_to((LAYOUT.venvs / bundle.wheels_digest).relative_to(LAYOUT.prefix))
    for f in version_files(LAYOUT, bundle):
        dest = root / f.path.relative_to("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(f.data)
        dest.chmod(f.mode)
    link = root / BIN_LINK.relative_to("/")
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(LAYOUT.bootseer)
    debian = root / "DEBIAN"
    debian.mkdir()
    for name, text in (
        ("preinst", PREINST),
        ("postinst", POSTINST),
        ("prerm", PRERM),
        ("postrm", POSTRM),
    ):
        (debian / name).write_text(text)
        (debian / name).chmod(0o755)


def pack(root: Path, version: str, deb: Path, compression: str = "zstd") -> None:
    """``DEBIAN/control`` (its Installed-Size from the tree), then ``dpkg-deb --build``
    (zstd at dpkg-deb's level, 3: 1.2 s and 79 MiB here; level 1 took 0.8 s for 89 MiB,
    not worth 10 MiB more for every node)."""
    size_kib = sum(p.lstat().st_size for p in root.rglob("*")) // 1024
    (root / "DEBIAN" / "control").write_text(
        f"Package: {PACKAGE}\n"
        f"Version: {version}\n"
        "Architecture: amd64\n"
        "Maintainer: bootseer <bootseer@localhost>\n"
        f"Installed-Size: {size_kib}\n"
        f"Depends: {DEPENDS}\n"
        f"Recommends: {RECOMMENDS}\n"
        "Section: admin\n"
        "Priority: optional\n"
        "Description: faster starts of Slurm training jobs (images, dependencies, checkpoints)\n"
        " The node agent, the Prolog and Epilog hooks, the SPANK plugin and the bootseer\n"
        " command, with their venv on Debian's python3. The site config, site key and\n"
        " store secrets are not in the package: bootseer install --deb puts them.\n"
    )
    cmd = ["dpkg-deb", "--root-owner-group", f"-Z{compression}", "--build", str(root), str(deb)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError(f"dpkg-deb failed ({r.returncode}): {r.stderr.strip()[-2000:]}")


def _venv_at_its_path(tree: Path, venv: Path, wheels: Path) -> None:
    """Build ``venv`` (a path under /opt/bootseer) into ``tree``: in a mount namespace
    of its own where ``tree`` is ``/opt/bootseer`` (over an empty tmpfs on ``/opt``, so
    nothing of this machine's ``/opt`` is seen or changed), so that its scripts name
    the path they will have on the nodes."""
    script = r"""
set -e
mount -t tmpfs -o mode=0755 bootseer-deb /opt
mkdir /opt/bootseer
mount --bind "$1" /opt/bootseer
"$2" -m venv "$3"
PIP_CONFIG_FILE=/dev/null "$3/bin/pip" install -q --no-index --no-cache-dir \
    --disable-pip-version-check --find-links "$4" bootseer
"$3/bin/bootseer" --help >/dev/null
touch "$3/.complete"
"""
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "-"]
    argv += [str(tree), PYTHON, str(venv), str(wheels.resolve())]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    r = subprocess.run(argv, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise BuildError(
            f"building the package's venv failed ({r.returncode}; needs root, {PYTHON} "
            f"and python3-venv): {r.stderr.strip()[-2000:]}"
        )


def main(argv: list[str] | None = None) -> int:
    """``python -m bootseer.install.debpkg [--out DIR] [--build-dir DIR]`` (scripts/build-deb)."""
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="build-deb", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("."), metavar="DIR")
    p.add_argument(
        "--build-dir", type=Path, default=Path("/var/tmp/bootseer-install"), metavar="DIR"
    )
    p.add_argument("--compression", default="zstd", choices=("zstd", "xz", "gzip", "none"))
    p.add_argument("--version", help="the package's version (default: bootseer's+build minute)")
    args = p.parse_args(argv)
    deb = build_deb(
        args.build_dir,
        args.out,
        lambda m: print(f"build-deb: {m}", file=sys.stderr, flush=True),
        args.compression,
        args.version,
    )
    print(deb)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
