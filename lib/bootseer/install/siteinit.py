"""``bootseer config --init STORE``: the site's own files, made once on the admin machine
(the site key and the site config), so that ``bootseer install`` has what it pushes.

Nothing that exists is overwritten: a second run with the same store says what is
there; a config naming another store is refused (change it by hand). A ``file://``
store's root is made only where its parent exists (the mounted share): the parts that
run as root never make one (an unmounted share would become a node's own store), but
the admin who names it here asks for it.

    >>> print(config_text("file:///shared/bootseer", Path("/etc/bootseer/site.key")))
    # bootseer's site config (docs/admin.md; README, "Site config")
    [site]
    key_file = "/etc/bootseer/site.key"
    <BLANKLINE>
    [store]
    uri = "file:///shared/bootseer"
    <BLANKLINE>
"""

from __future__ import annotations

import os
import secrets
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

from bootseer.errors import ConfigError


def config_text(store: str, key_file: Path) -> str:
    return (
        '# bootseer\'s site config (docs/admin.md; README, "Site config")\n'
        f'[site]\nkey_file = "{key_file}"\n\n[store]\nuri = "{store}"\n'
    )


def init_site(config: Path, store: str, key_file: Path) -> list[str]:
    """Make what is missing of ``key_file``, ``config`` and a ``file://`` store's root;
    returns one line per file: made, or kept."""
    parts = urlsplit(store)
    if parts.scheme not in ("file", "s3") or (parts.scheme == "file" and parts.netloc):
        raise ConfigError(f"store {store!r}: give file:///PATH (a shared file system) or s3://")
    if '"' in store or "\\" in store or "\n" in store:
        raise ConfigError(f"store {store!r}: no quotes, backslashes or newlines")
    root = Path(parts.path) if parts.scheme == "file" else None
    if root is not None and not root.is_dir() and not root.parent.is_dir():
        raise ConfigError(  # before anything is made
            f"{root.parent} is not there (is the share mounted here?): the store's root "
            "is made only in a directory that exists"
        )
    said = []
    if config.exists():
        try:
            have = tomllib.loads(config.read_text()).get("store", {}).get("uri")
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{config}: {exc}") from None
        if have != store:
            raise ConfigError(
                f"{config} exists and names the store {have!r}, not {store!r}: change it by "
                "hand (bootseer install pushes what it says), or remove it first"
            )
        said.append(f"{config}: kept (it names {store})")
    if key_file.exists():
        said.append(f"{key_file}: kept")
    else:
        key_file.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        said.append(f"{key_file}: made (a new site key, root's alone)")
    if not config.exists():
        config.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        tmp = config.with_name(config.name + ".new")
        tmp.write_text(config_text(store, key_file))
        tmp.chmod(0o644)
        tmp.rename(config)
        said.append(f"{config}: made (store {store})")
    if root is not None and root.is_dir():
        said.append(f"{root}: the store's root is there")
    elif root is not None:
        root.mkdir(mode=0o755)
        said.append(f"{root}: made (the store's root)")
    return said
