"""The version a node runs and the one before it, kept for ``bootseer install --rollback``.

A version is what a release of bootseer puts on a node: its venv (``venvs/<digest>``,
chosen by the ``venv`` link) and its files under the prefix (the plugin, the hooks and
their wrappers, the docs) with the agent's unit. The site's files (the config, the site
key, the store secrets) are no version's: a rollback leaves them as they are.

Each install that completes writes ``install.json`` (:attr:`Layout.state`): the venv and
each file's digest and mode. The next install that changes the version first copies the
files ``install.json`` names into ``previous/``, once each still has its recorded digest
(a node left half-way by an install cut off keeps the previous it had); the venv needs
no copy (an install keeps the one the link named). ``--rollback`` swaps the two: the
kept files go back and the link to the kept venv, and what ran becomes the previous, so
a second ``--rollback`` goes forward again. One old version at most: keeping a new one
replaces it, and the install drops every other venv.

All of it runs on the node in one round trip (:data:`SCRIPT`, the node's own Python,
stdlib alone); each file is written beside its place and renamed onto it.

    >>> version_file(Layout(), Path("/opt/bootseer/lib/slurm/bootseer.so"))
    True
    >>> version_file(Layout(), Path("/etc/bootseer/config.toml"))
    False
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bootseer.install.layout import Layout
from bootseer.install.remote import Node, RemoteError

SCRIPT = r"""
import hashlib, json, os, shutil, sys
req = json.load(sys.stdin)
prefix, state_path, prev = req["prefix"], req["state"], req["previous"]
link = os.path.join(prefix, "venv")

def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

def load(p):
    try:
        with open(p) as f:
            return json.load(f)
    except FileNotFoundError:
        return None

def write_json(p, doc):
    tmp = p + ".bootseer-install"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    os.chmod(tmp, 0o644)
    os.replace(tmp, p)

def whole(state):
    # The version state names is on the node as recorded: every file, the venv link.
    if state is None:
        return "no install.json (installed before versions were kept)"
    try:
        if os.readlink(link) != state["venv"]:
            return "its venv link changed since"
    except OSError:
        return "no venv link"
    if not os.path.exists(os.path.join(prefix, state["venv"], ".complete")):
        return "its venv is incomplete"
    for p, (digest, _mode) in state["files"].items():
        try:
            if sha(p) != digest:
                return p + " changed since"
        except OSError:
            return p + " is gone"
    return ""

def copy_into(d, state):
    # The files of state into d/files/<n>, and d/manifest.json; d made anew.
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "files"), mode=0o755)
    names = {}
    for i, p in enumerate(sorted(state["files"])):
        shutil.copyfile(p, os.path.join(d, "files", str(i)))
        names[p] = str(i)
    write_json(os.path.join(d, "manifest.json"), {**state, "names": names})

def place(src, p, mode):
    os.makedirs(os.path.dirname(p), mode=0o755, exist_ok=True)
    tmp = p + ".bootseer-install"
    shutil.copyfile(src, tmp)
    os.chown(tmp, 0, 0)
    os.chmod(tmp, mode)
    os.replace(tmp, p)

op = req["op"]
if op == "record":
    files = {p: [sha(p), os.lstat(p).st_mode & 0o7777] for p in req["files"] if os.path.exists(p)}
    write_json(state_path, {"venv": os.readlink(link), "files": files})
    print(json.dumps({"ok": True}))
elif op == "keep":
    state = load(state_path)
    why = whole(state)
    if not why:
        new = prev + ".new"
        copy_into(new, state)
        shutil.rmtree(prev, ignore_errors=True)
        os.rename(new, prev)
    print(json.dumps({"kept": not why, "why": why}))
elif op in ("rollback", "check"):
    kept = load(os.path.join(prev, "manifest.json"))
    if kept is None:
        print(json.dumps({"error": "no previous version kept here"}))
        sys.exit(0)
    if not os.path.exists(os.path.join(prefix, kept["venv"], ".complete")):
        print(json.dumps({"error": "the previous version's venv " + kept["venv"] + " is gone"}))
        sys.exit(0)
    for p, n in kept["names"].items():
        if sha(os.path.join(prev, "files", n)) != kept["files"][p][0]:
            print(json.dumps({"error": "the kept copy of " + p + " is damaged"}))
            sys.exit(0)
    now = load(state_path)
    swap = not whole(now)
    changed = sorted(p for p, (d, m) in kept["files"].items()
                     if not os.path.exists(p) or sha(p) != d or (os.stat(p).st_mode & 0o7777) != m)
    extra = sorted(set(now["files"]) - set(kept["files"])) if swap else []
    out = {"venv": kept["venv"], "files": changed + extra, "swap": swap}
    if op == "check":
        print(json.dumps(out))
        sys.exit(0)
    if swap:  # what runs now becomes the previous
        copy_into(prev + ".new", now)
    for p in changed:
        place(os.path.join(prev, "files", kept["names"][p]), p, kept["files"][p][1])
    for p in extra:
        os.unlink(p)
    tmp = os.path.join(prefix, ".venv.bootseer-install")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(kept["venv"], tmp)
    os.replace(tmp, link)
    write_json(state_path, {"venv": kept["venv"], "files": kept["files"]})
    shutil.rmtree(prev, ignore_errors=True)
    if swap:
        os.rename(prev + ".new", prev)
    print(json.dumps(out))
"""


@dataclass(frozen=True)
class Rollback:
    """What a rollback did (or would do) on a node: the venv it returns to, the files
    put back or removed, and whether the version it left is kept in turn."""

    venv: str
    files: tuple[str, ...]
    swap: bool


def version_file(lay: Layout, path: Path) -> bool:
    """A file of the version (under the prefix, or the agent's unit), not the site's."""
    return path.is_relative_to(lay.prefix) or path == lay.unit


def _run(
    node: Node, python: str, lay: Layout, op: str, files: tuple[str, ...] = ()
) -> dict[str, object]:
    request = {
        "op": op,
        "prefix": str(lay.prefix),
        "state": str(lay.state),
        "previous": str(lay.previous),
        "files": list(files),
    }
    r = node.run([python, "-c", SCRIPT], json.dumps(request).encode(), timeout=300)
    if r.status != 0:
        raise RemoteError(f"{op} of the install's versions failed: {r.err.strip()[-500:]}")
    doc: dict[str, object] = json.loads(r.out)
    return doc


def record(node: Node, python: str, lay: Layout, files: list[Path]) -> None:
    """``install.json``: the version now on the node, as its files are."""
    _run(node, python, lay, "record", tuple(str(p) for p in files))


def keep(node: Node, python: str, lay: Layout) -> str:
    """Keep the version on the node as the previous one, before another replaces it;
    returns why not ("" when kept)."""
    return str(_run(node, python, lay, "keep")["why"])


def rollback(node: Node, python: str, lay: Layout, dry_run: bool = False) -> Rollback:
    """Return the node to its previous version (RemoteError when none is kept)."""
    doc = _run(node, python, lay, "check" if dry_run else "rollback")
    if "error" in doc:
        raise RemoteError(str(doc["error"]))
    files = doc["files"]
    assert isinstance(files, list)
    return Rollback(str(doc["venv"]), tuple(map(str, files)), bool(doc["swap"]))
