"""The root-owned files bootseer reads on the node: the site config, the site key and
the store's secrets."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from bootseer.doctor.node import Node, needs_config
from bootseer.doctor.result import Check, ok, problem
from bootseer.errors import ConfigError, NoSiteConfig
from bootseer.rootfile import root_only


def check_config(node: Node) -> Check:
    """The site config exists, parses, is readable by users and writable by root alone."""
    name = "config"
    if node.cfg is None:
        if isinstance(node.config_error, NoSiteConfig):
            return problem(
                name,
                f"no site config at {node.config_path} "
                "(bootseer would use defaults: a node-local store)",
                f"write {node.config_path} (README: Site config) or set $BOOTSEER_CONFIG",
            )
        return problem(name, str(node.config_error), f"fix {node.config_path}")
    st = os.stat(node.config_path)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != 0 or mode & 0o022:
        return problem(
            name,
            f"{node.config_path}: uid {st.st_uid}, mode {mode:04o}: others may change it",
            f"chown root {node.config_path}; chmod 0644 {node.config_path}",
        )
    if not mode & 0o004:
        return problem(
            name,
            f"{node.config_path}: mode {mode:04o}: users' bootseer cannot read it",
            f"chmod 0644 {node.config_path} (secrets belong in [site] key_file)",
        )
    return ok(name, f"{node.config_path} (mode {mode:04o})")


def _not_root_only(name: str, path: Path, st: os.stat_result, more_fix: str) -> Check | None:
    """The problem of a file that must be root's alone (site key, store secrets), or None."""
    if root_only(st):
        return None
    kind = "" if stat.S_ISREG(st.st_mode) else "not a regular file, "
    mode = stat.S_IMODE(st.st_mode)
    return problem(
        name,
        f"{path}: {kind}uid {st.st_uid}, mode {mode:04o}: must be root's alone",
        f"chown root {path}; chmod 0600 {path}{more_fix}",
    )


@needs_config("site key")
def check_site_key(node: Node) -> Check:
    """``[site] key_file``: a regular file, root's, mode 0600, holding a key."""
    name = "site key"
    assert node.cfg is not None
    path = node.cfg.site.key_file
    make = f"umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > {path}"
    try:
        st = os.lstat(path)
    except OSError as exc:
        return problem(name, f"{path}: {exc.strerror}: no p2p, nothing sealed", make)
    if (bad := _not_root_only(name, path, st, _rotate_site_key(path, st))) is not None:
        return bad
    if os.geteuid() != 0:
        return ok(name, f"{path} (0600 root; contents need root to read)")
    from bootseer.sitekey import read_key_file

    try:
        keys = read_key_file(path)
    except ConfigError as exc:
        return problem(name, str(exc), make)
    return ok(name, f"{path} (0600 root, {len(keys)} key{'s' if len(keys) > 1 else ''})")


def _rotate_site_key(path: Path, st: os.stat_result) -> str:
    """What a site key that others could read needs besides its mode: a new key (first
    line, the old one kept after it for the records it sealed: docs/security.md,
    Rotation), on every node. Nothing for one only root could read."""
    if st.st_uid == 0 and not stat.S_IMODE(st.st_mode) & 0o044:
        return ""
    new = "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'"
    return (
        f"; then rotate it, others could read it: umask 077; ({new}; echo; cat {path}) > "
        f"{path}.new && mv {path}.new {path}; copy it to every node and restart their "
        "agents: bootseer install NODESET --restart-agents"
    )


@needs_config("store secrets")
def check_store_secrets(node: Node) -> Check:
    """``[store] secrets_file``: absent (anonymous access) or root's alone (0600)."""
    name = "store secrets"
    assert node.cfg is not None
    path = node.cfg.store.secrets_file
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ok(name, f"{path} absent: the store is opened anonymously")
    except OSError as exc:
        return problem(name, f"{path}: {exc.strerror}", f"ls -l {path}")
    rotate = "; rotate the keys others could read"
    if (bad := _not_root_only(name, path, st, rotate)) is not None:
        return bad
    if os.geteuid() != 0:
        return ok(name, f"{path} (0600 root; contents need root to read)")
    from bootseer.credentials import read_secrets_file

    try:
        creds = read_secrets_file(path)
    except ConfigError as exc:
        return problem(name, str(exc), f"fix {path} (docs/security.md, Store secrets)")
    return ok(name, f"{path} (0600 root, {'anonymous' if creds.anonymous else 'keys set'})")
