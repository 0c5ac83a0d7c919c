"""``bootseer config [--check | --init STORE]``: show the site config in effect, check it,
or make the site's files once (bootseer.install.siteinit)."""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs a mark from a job script milliseconds

if TYPE_CHECKING:
    import argparse
    from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("config", help="show or check the site config")
    p.add_argument("--check", action="store_true", help="only check; exit 1 on a bad config")
    p.add_argument(
        "--init",
        metavar="STORE",
        help="make the site key, the site config naming STORE (file:///shared/bootseer or "
        "s3://...) and a file:// store's root, where missing (nothing is overwritten); then "
        "check them",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from bootseer.config import config_path, load_config  # here: `bootseer phase` skips it

    if args.init:
        _init(args.init)
    cfg = load_config()
    if args.check or args.init:
        print(f"{cfg.source or config_path()}: ok" if cfg.source else "no site config; defaults")
        return max(
            _check_store(cfg),
            _check_key(cfg.site.key_file),
            _check_secrets(cfg.store.secrets_file),
        )
    return _show(cfg)


def _init(store: str) -> None:
    import os

    from bootseer.config import config_path, load_config
    from bootseer.errors import ConfigError
    from bootseer.install.siteinit import init_site

    if os.geteuid() != 0:
        raise ConfigError(
            "bootseer config --init makes root's files (the site key): run it as root"
        )
    path = config_path()
    key_file = load_config().site.key_file if path.exists() else path.parent / "site.key"
    for line in init_site(path, store, key_file):
        print(line)


def _check_store(cfg: Any) -> int:
    """The store must be there: looking never creates it (an unmounted share would
    otherwise become a node-local store)."""
    from bootseer.config import config_path
    from bootseer.doctor import store_check

    check = store_check(cfg, cfg.source or config_path())
    print(f"store {check.detail}" if check.ok else f"{check.detail}; {check.fix}")
    return 0 if check.ok else 1


def _check_secrets(path: Any) -> int:
    """The store's secrets file, as root-run parts will load it (never its contents)."""
    import os

    from bootseer.credentials import read_secrets_file
    from bootseer.errors import ConfigError

    if os.geteuid() != 0:
        print(f"store secrets file {path}: not checked (only root may read it)")
        return 0
    try:
        creds = read_secrets_file(path)
    except ConfigError as exc:
        print(f"{exc} (root-run parts cannot open the store)")
        return 1
    how = "anonymous access" if creds.anonymous else "credentials set"
    exists = "ok" if os.path.lexists(path) else "absent"
    print(f"store secrets file {path}: {exists} ({how})")
    return 0


def _check_key(path: Any) -> int:
    """The site key, as the root-run parts will load it (only root may read it)."""
    import os

    from bootseer.sitekey import load_keys

    if os.geteuid() != 0:
        print(f"site key {path}: not checked (only root may read it)")
        return 0
    keys = load_keys(path)
    if not keys.keys:
        print(f"site key: {keys.missing} (root-run parts will trust no stored record)")
        return 1
    print(f"site key {path}: ok ({len(keys.keys)} key{'s' if len(keys.keys) > 1 else ''})")
    return 0


def _show(cfg: Any) -> int:
    import dataclasses
    import json

    doc = dataclasses.asdict(cfg)
    doc.pop("template")  # for_node's bookkeeping, not a setting
    print(json.dumps(doc, indent=2, default=str))
    return 0
