"""One node's install: compare what it has with what it should have, change the difference.

A first round trip (a small stdlib script run by the node's Python) reports the
interpreter, each file's digest, mode and owner, and the venv in place; what differs is
written (:meth:`~bootseer.install.remote.Node.put`), so a second install changes
nothing. The venv is built on the node from the copied wheels alone (``pip --no-index``)
in ``venvs/<digest of the wheels>``, marked complete last, and only then does the
``venv`` link switch to it (one rename): a venv cut off half way is never used, and the
hooks and agent keep the old one until then. The node's Python must be the wheels'
minor version (``cp311``) with ``venv``, and a compute node needs fuse3: otherwise the
install stops there, clearly, before anything is written (never at a job's restore).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bootseer.install import releases
from bootseer.install.bundle import Bundle
from bootseer.install.files import NodeFile
from bootseer.install.layout import Layout
from bootseer.install.remote import Node, RemoteError
from bootseer.install.trust import check_node

PROBE = r"""
import hashlib, json, os, sys
req = json.load(sys.stdin)
def digest(p):
    try:
        st = os.lstat(p)
    except OSError:
        return None
    h = hashlib.sha256()
    try:
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return None
    return [h.hexdigest(), st.st_mode & 0o7777, st.st_uid, st.st_gid]
def link(p):
    try:
        return os.readlink(p)
    except OSError:
        return None
ready = link(req["venv"]) == req["want_link"] and os.path.exists(
    os.path.join(req["want"], ".complete"))
def fuse():
    import ctypes.util, shutil
    return {
        "fusermount3": bool(shutil.which("fusermount3", path="/usr/local/bin:/usr/bin:/bin")),
        "libfuse3": bool(ctypes.util.find_library("fuse3")),
    }
mods = {}
for m in ("venv", "ensurepip"):
    try:
        __import__(m)
        mods[m] = True
    except ImportError:
        mods[m] = False
print(json.dumps({
    "version": list(sys.version_info[:3]),
    "modules": mods,
    "files": {p: digest(p) for p in req["files"]},
    # The wheels only matter for a venv still to build.
    "wheels": {} if ready else {p: digest(p) for p in req["wheels"]},
    "venv_link": link(req["venv"]),
    "venv_complete": os.path.exists(os.path.join(req["want"], ".complete")),
    "bin_link": link(req["bin"]) if req["bin"] else None,
    "systemd": os.path.isdir("/run/systemd/system"),
    "dirs": {p: os.path.isdir(p) for p in req["dirs"]},
    "fuse": fuse() if req["fuse"] else {},
    "recorded": os.path.exists(req["state"]),
}))
"""


class NodeRefused(RemoteError):
    """The node cannot take this install (its Python); nothing was changed on it."""


@dataclass
class NodeReport:
    node: str
    status: Literal["installed", "removed", "unchanged", "would change", "rolled back", "failed"]
    changes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str = ""
    # What the running agent uses changed: its venv, or a file it reads (the config, the
    # secrets, the site key): it runs the old until restarted (install.agents).
    agent_stale: bool = False

    def line(self) -> str:
        """The node's summary, without its name (the fanout folds nodes by it)."""
        if self.status == "failed":
            return f"FAILED: {self.error}"
        what = f"{self.status}"
        if self.changes:
            what += ": " + ", ".join(self.changes)
        if self.notes:
            what += " (" + "; ".join(self.notes) + ")"
        return what


@dataclass(frozen=True)
class Target:
    """What one node should hold: its layout (resolved), files, the bundle's wheels."""

    layout: Layout
    files: list[NodeFile]
    bundle: Bundle
    python: str = "/usr/bin/python3"
    # Directories made if missing (root's, 0755), and left as they are: [metrics]
    # textfile_dir, which node_exporter reads.
    dirs: tuple[Path, ...] = ()
    # A compute node runs the agent (its unit, --restart-agents); a client host does not.
    agent: bool = True


def install_node(
    node: Node, target: Target, dry_run: bool = False, log: Callable[[str], None] = lambda _: None
) -> NodeReport:
    lay, bundle = target.layout, target.bundle
    want_venv = lay.venvs / bundle.wheels_digest
    wheels = {lay.wheels / w.name: w for w in bundle.wheels}
    request = {
        "files": [str(f.path) for f in target.files],
        "wheels": [str(p) for p in wheels],
        "want_link": str(want_venv.relative_to(lay.prefix)),
        "venv": str(lay.venv),
        "want": str(want_venv),
        "bin": str(lay.bin_dir / "bootseer") if lay.bin_dir else "",
        "dirs": [str(d) for d in target.dirs],
        "fuse": target.agent,  # the agent serves images over FUSE; a client host has none
        "state": str(lay.state),
    }
    r = node.run([target.python, "-c", PROBE], json.dumps(request).encode(), timeout=120)
    if r.status == 127 or (r.status != 0 and "No such file" in r.err):
        raise NodeRefused(
            f"no {target.python} there: apt-get install python3 python3-venv "
            "(bootseer's venv is built on the node's own Python)"
        )
    if r.status != 0:
        raise RemoteError(f"probing the node failed: {r.err.strip()[-500:]}")
    have = json.loads(r.out)
    version = tuple(have["version"])
    if version[:2] != bundle.python:
        raise NodeRefused(
            f"its {target.python} is {'.'.join(map(str, version))}; the wheels are "
            f"built for Python {'.'.join(map(str, bundle.python))}: "
            "install that Python on the node (--python PATH), or build on a matching one"
        )
    missing = [m for m, ok in have["modules"].items() if not ok]
    if missing:
        raise NodeRefused(
            f"its {target.python} has no {' or '.join(missing)}: apt-get install python3-venv"
        )
    if lacking := missing_fuse(have["fuse"]):
        raise NodeRefused(
            f"no {' or '.join(lacking)} there (the agent serves images over FUSE): "
            "apt-get install fuse3"
        )

    # Root runs and reads what is under these: no one else may be able to change them.
    trusted = sorted(
        {f.path.parent for f in target.files} | {lay.prefix, lay.etc, lay.wheels, lay.venvs}
    )
    check_node(node, target.python, trusted)

    def stale(f: NodeFile) -> bool:
        got = have["files"].get(str(f.path))
        return got is None or got[0] != _sha(f.data) or got[1] != f.mode or got[2:] != [0, 0]

    files = [f for f in target.files if stale(f)]
    venv_ok = have["venv_link"] == str(want_venv.relative_to(lay.prefix)) and have["venv_complete"]
    send = (
        []
        if venv_ok
        else [
            (p, w)
            for p, w in wheels.items()
            if (have["wheels"].get(str(p)) or [None])[0] != bundle.digests[w.name]
        ]
    )
    bin_link = str(lay.bootseer)
    link_ok = lay.bin_dir is None or have["bin_link"] == bin_link
    changes = []
    if files:
        names = [_short(f.path, lay) for f in files]
        more = f", +{len(names) - 2}" if len(names) > 2 else ""
        changes.append(f"{len(names)} files ({', '.join(names[:2])}{more})")
    if not venv_ok:
        changes.append(f"venv {bundle.wheels_digest} ({len(send)} wheels copied)")
    if not link_ok:
        changes.append(f"{lay.bin_dir}/bootseer")
    missing = [d for d in target.dirs if not have["dirs"].get(str(d))]
    changes += [f"{d}/" for d in missing]
    report = NodeReport(node.name, "unchanged")
    # The agent reads none of the prefix's files but its venv (the hooks, plugin, docs).
    report.agent_stale = target.agent and (
        not venv_ok
        or any(not f.path.is_relative_to(lay.prefix) and f.path != lay.unit for f in files)
    )
    if not have["systemd"] and lay.unit is not None and target.agent:
        report.notes.append("no systemd here: start the agent yourself")
    version_files = [f.path for f in target.files if releases.version_file(lay, f.path)]
    new_version = not venv_ok or any(releases.version_file(lay, f.path) for f in files)
    if not changes:
        if not dry_run and not have["recorded"]:  # installed before versions were kept
            releases.record(node, target.python, lay, version_files)
        return report
    report.changes = changes
    if dry_run:
        report.status = "would change"
        return report
    dirs = sorted(
        {str(f.path.parent) for f in files}
        | {str(lay.wheels), str(lay.venvs)}
        | {str(d) for d in missing}
    )
    # Made where missing (0755, root's); a directory already there keeps its mode and owner
    # (install -d would reset a site's /usr/local/bin, 2775 root:staff on Debian).
    mkdirs = 'umask 022 && mkdir -p -- "$@"'
    node.check(["sh", "-c", mkdirs, "-", *dirs])
    check_node(node, target.python, trusted)  # a directory a user made first is hers
    # The version there now, kept for a rollback (if whole: a node an install left half
    # way keeps the previous it had).
    if (
        new_version
        and have["venv_link"] is not None
        and (why := releases.keep(node, target.python, lay))
    ):
        log(f"{node.name}: the version there is not kept for a rollback: {why}")
    for f in files:
        node.put(f.path, f.data, f.mode)
    if not venv_ok:
        size = sum(w.stat().st_size for _, w in send)
        log(f"{node.name}: copying {len(send)} wheels ({size / (1 << 20):.0f} MiB) for its venv")
        for p, w in send:
            node.put(p, w, 0o644)
        _build_venv(node, target, want_venv)
    if not link_ok:
        assert lay.bin_dir is not None
        node.check(["sh", "-c", mkdirs, "-", str(lay.bin_dir)])
        tmp = f"{lay.bin_dir}/.bootseer.bootseer-install"
        node.check(
            [
                "sh",
                "-c",
                'ln -sfn "$1" "$2" && mv -Tf "$2" "$3"',
                "-",
                bin_link,
                tmp,
                f"{lay.bin_dir}/bootseer",
            ]
        )
    if (
        lay.unit is not None
        and target.agent
        and have["systemd"]
        and any(f.path == lay.unit for f in files)
    ):
        node.check(["systemctl", "daemon-reload"])
        node.check(["systemctl", "enable", "--now", "bootseer-agent.service"])
    _verify(node, lay)
    releases.record(node, target.python, lay, version_files)
    report.status = "installed"
    return report


def missing_fuse(found: dict[str, bool]) -> list[str]:
    """What of fuse3 the probe did not find on a compute node (``fusermount3``, which
    users' mounts need, and ``libfuse3``, which the agent's pyfuse3 loads).

    >>> missing_fuse({"fusermount3": True, "libfuse3": False})
    ['libfuse3']
    """
    return [name for name in ("fusermount3", "libfuse3") if name in found and not found[name]]


def _build_venv(node: Node, target: Target, venv: Path) -> None:
    lay = target.layout
    rel = venv.relative_to(lay.prefix)
    script = f"""
set -e
cd {q(lay.wheels)}
for w in *.whl; do  # wheels of an earlier install: pip must not pick one of them
  case " {" ".join(w.name for w in target.bundle.wheels)} " in *" $w "*) ;; *) rm -f "$w" ;; esac
done
rm -rf {q(venv)}
{q(target.python)} -m venv {q(venv)}
PIP_CONFIG_FILE=/dev/null {q(venv / "bin" / "pip")} install -q --no-index --no-cache-dir \\
    --disable-pip-version-check --find-links {q(lay.wheels)} bootseer
{q(venv / "bin" / "bootseer")} --help >/dev/null
touch {q(venv / ".complete")}
old=$(readlink {q(lay.venv)} || true)
ln -sfn {q(rel)} {q(lay.prefix / ".venv.bootseer-install")}
mv -Tf {q(lay.prefix / ".venv.bootseer-install")} {q(lay.venv)}
# Keep the venv the hooks and a running agent may still use; older ones go.
keep="$(basename {q(rel)}) $(basename "${{old:-none}}")"
for v in {q(lay.venvs)}/*; do
  case " $keep " in *" $(basename "$v") "*) ;; *) rm -rf "$v" ;; esac
done
"""
    node.check(["sh", "-c", script], timeout=900)


def _verify(node: Node, lay: Layout) -> None:
    """A job's user runs the venv's bootseer (the job script's ``bootseer deps run``)."""
    argv = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    r = node.run([*argv, str(lay.bootseer), "--help"])
    if r.status != 0:
        raise RemoteError(f"an ordinary user cannot run {lay.bootseer}: {r.err.strip()[-300:]}")


def q(p: object) -> str:
    return shlex.quote(str(p))


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _short(path: Path, lay: Layout) -> str:
    for base in (lay.prefix, lay.etc):
        if path.is_relative_to(base):
            return str(path.relative_to(base))
    return str(path)
