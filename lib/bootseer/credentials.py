"""Store credentials: a root-only secrets file, apart from the site config users read.

``[store] secrets_file`` (default: ``secrets.toml`` next to the site config, so
``/etc/bootseer/secrets.toml``) holds::

    [store]
    access_key = "..."
    secret_key = "..."

It must be a regular file owned by root with no access for group or others (0600 or
0400), and is not followed through a link; one that others can read is refused (the
keys in it may already have leaked: rotate them). Only processes running as root load
it: the prolog, the epilog, the agent, the checkpoint mount daemon, and an admin's
``bootseer`` commands. Every other process opens the store anonymously (read-only where
the store is set up so; docs/security.md, "Store secrets").
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from bootseer.errors import ConfigError
from bootseer.rootfile import read_root_only

MAX_SECRETS_FILE = 64 << 10


@dataclass(frozen=True)
class Credentials:
    access_key: str = ""
    secret_key: str = field(default="", repr=False)

    @property
    def anonymous(self) -> bool:
        return not self.access_key


def read_secrets_file(path: Path) -> Credentials:
    """The credentials in ``path``; a missing file means none (anonymous access)."""
    try:
        raw = read_root_only(
            path,
            "store secrets file",
            MAX_SECRETS_FILE,
            "; if others could read it, rotate its keys",
        )
    except FileNotFoundError:
        return Credentials()
    try:
        data = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"store secrets file {path}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"store"})
    store = data.get("store", {})
    if unknown or not isinstance(store, dict):
        raise ConfigError(f"store secrets file {path}: only a [store] table belongs here")
    bad = sorted(set(store) - {"access_key", "secret_key"})
    if bad:
        raise ConfigError(
            f"store secrets file {path}: unknown key store.{bad[0]} "
            "(known here: access_key, secret_key)"
        )
    access, secret = store.get("access_key", ""), store.get("secret_key", "")
    if not isinstance(access, str) or not isinstance(secret, str):
        raise ConfigError(f"store secrets file {path}: access_key and secret_key are strings")
    if bool(access) != bool(secret):
        raise ConfigError(f"store secrets file {path}: set both access_key and secret_key")
    return Credentials(access, secret)


def store_credentials(secrets_file: Path) -> Credentials:
    """What this process opens the store with: the secrets file's credentials when it
    runs as root, none (anonymous) otherwise; a user's process never reads the file."""
    if os.geteuid() != 0:
        return Credentials()
    return read_secrets_file(secrets_file)
