"""What the admin machine builds once for every node: wheels, the plugin, hooks, docs, unit.

The wheels are bootseer's and those of its dependencies (pyfuse3 compiled here, once),
for the interpreter that builds them (``cp311``); a node builds its venv from them with
``pip --no-index`` on its own Python of the same minor version. The SPANK plugin is
built with the checkout's ``spank/Makefile``. Hooks, docs and the unit come from the
checkout, so ``bootseer install`` runs from a clone of bootseer (the venv
``scripts/bootstrap`` makes), not from an installed wheel.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import bootseer
from bootseer.errors import BootseerError
from bootseer.stepapi import HOOKS


class BuildError(BootseerError):
    """The admin machine could not build what the nodes get."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Bundle:
    top: Path  # the checkout: prolog/, epilog/, docs/, packaging/
    wheels: tuple[Path, ...]
    digests: dict[str, str]  # wheel file name -> sha256
    plugin: Path
    python: tuple[int, int]  # the wheels' interpreter (major, minor)

    @property
    def wheels_digest(self) -> str:
        """One name for this set of wheels: the venv built from it is ``venvs/<this>``."""
        text = "".join(f"{n} {d}\n" for n, d in sorted(self.digests.items()))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def checkout() -> Path:
    """The clone this bootseer runs from (an editable install), or BuildError."""
    top = Path(bootseer.__file__).resolve().parents[2]
    if not all((top / hook / f"bootseer-{hook}").is_file() for hook in HOOKS):
        raise BuildError(
            f"bootseer install builds from a checkout of bootseer; {bootseer.__file__} is not "
            "in one: run it from a clone's venv (scripts/bootstrap)"
        )
    return top


def build(build_dir: Path, log: Callable[[str], None] = lambda _: None) -> Bundle:
    """Wheels into ``build_dir/wheels`` (replaced whole), the plugin in the checkout."""
    top = checkout()
    own_build_dir(build_dir)
    final = build_dir / "wheels"
    source = source_digest(top)
    stamp = final / ".source"
    if stamp.exists() and stamp.read_text().strip() == source:
        log(f"the wheels in {final} are this checkout's (source {source[:16]})")
    else:
        _build_wheels(top, build_dir, source, log)
    log("building the SPANK plugin (make -C spank bootseer.so)")
    r = subprocess.run(
        ["make", "-s", "-C", str(top / "spank"), "bootseer.so"], capture_output=True, text=True
    )
    if r.returncode != 0:
        raise BuildError(
            f"make -C {top / 'spank'} failed ({r.returncode}; needs libslurm-dev): "
            f"{r.stderr.strip()[-2000:]}"
        )
    wheels = tuple(sorted(final.glob("*.whl")))
    return Bundle(
        top=top,
        wheels=wheels,
        digests={w.name: sha256_file(w) for w in wheels},
        plugin=top / "spank" / "bootseer.so",
        python=(sys.version_info.major, sys.version_info.minor),
    )


def own_build_dir(build_dir: Path) -> None:
    """``build_dir``, made 0700 if missing, must be this user's alone, and so must the
    directories above it (or be sticky, as ``/var/tmp``): whoever can change it chooses
    the wheels every node's venv is built from, and the hooks run that venv as root.
    The default, ``/var/tmp/bootseer-install``, is a name any user of the admin machine
    could take first."""
    import stat

    build_dir = build_dir.absolute()
    build_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    me = os.geteuid()
    for d in (build_dir, *build_dir.parents):
        st = os.lstat(d)
        mode = stat.S_IMODE(st.st_mode)
        writable = mode & 0o002 or (mode & 0o020 and st.st_gid != 0)
        if d == build_dir:
            bad = not stat.S_ISDIR(st.st_mode) or st.st_uid != me or mode & 0o022
        else:
            bad = st.st_uid not in (0, me) or (writable and not mode & stat.S_ISVTX)
        if bad:
            raise BuildError(
                f"{d} (uid {st.st_uid}, mode {mode:04o}) is not yours alone: another user "
                "could put the wheels there that every node's venv is built from, and the "
                f"hooks run it as root. Remove it, or build elsewhere (--build-dir DIR, "
                "a directory of yours, mode 0700)"
            )


def source_digest(top: Path) -> str:
    """What the wheels are built from: the package's files and this interpreter."""
    h = hashlib.sha256(sys.version.encode())
    files = [top / "pyproject.toml", top / "README.md"]
    files += sorted(
        p
        for p in (top / "lib").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and ".egg-info" not in str(p)
    )
    for p in files:
        h.update(f"{p.relative_to(top)}\0{sha256_file(p)}\n".encode())
    return h.hexdigest()


def _build_wheels(top: Path, build_dir: Path, source: str, log: Callable[[str], None]) -> None:
    fresh = build_dir / "wheels.new"
    shutil.rmtree(fresh, ignore_errors=True)
    log(f"building wheels of {top} and its dependencies in {build_dir}")
    # SOURCE_DATE_EPOCH: the same checkout gives the same wheel, byte for byte, so a
    # second install finds every node unchanged.
    env = {**os.environ, "SOURCE_DATE_EPOCH": "315532800", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    # From a copy of what the package is made of: setuptools builds in the source tree
    # and its build/ keeps modules the checkout no longer has, which would reach nodes.
    src = build_dir / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(top / name, src / name)
    shutil.copytree(
        top / "lib", src / "lib", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(fresh), str(src)]
    if (build_dir / "wheels").is_dir():
        # The dependencies' wheels of the last build are candidates too: a rebuild after
        # a change to bootseer alone needs neither the index nor a compiler for them.
        cmd[4:4] = ["--find-links", str(build_dir / "wheels")]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise BuildError(f"pip wheel failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    (fresh / ".source").write_text(source + "\n")
    final = build_dir / "wheels"
    shutil.rmtree(final, ignore_errors=True)
    os.rename(fresh, final)
