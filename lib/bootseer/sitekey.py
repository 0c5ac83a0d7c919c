"""The site key: what root-run parts write, root-run parts can tell from a forgery.

Snapshot manifests and refs, image manifests and name/path records, traces and
checkpoint manifests live in a store that users may be able to write. Root-run parts
(prolog, epilog, node agent, the checkpoint mount daemon, an admin's ``bootseer image
add``) *seal* each such record with a MAC under the site key, a root-only file that is
the same on every node (``[site] key_file``); when they read one back they *open* it,
and refuse it unless the MAC verifies, as if it were missing or damaged.

The key file holds one key per line, the current one first (blank lines and ``#``
comments are ignored): records are sealed with the first and opened with any, so an
admin rotates by putting a new key first, distributing the file, and dropping the old
line once every record that matters was rewritten (or may be recomputed).

Each purpose has its own subkey, ``HMAC-SHA256(key, "bootseer site subkey v1\\0" +
purpose)``, and the MAC covers the record's store key too, so a sealed record is
good for one purpose at one place only: a user who copies alice's sealed ref or
manifest elsewhere (or a trace over a manifest) gets a record that does not open.

A sealed record is the writer's JSON object with a last member ``"mac"``: the MAC is
over the exact bytes of the object without it, so no JSON is parsed before it
verifies::

    >>> keys = SiteKeys([b"k" * 32])
    >>> raw = keys.seal("demo", "a/b.json", b'{"x":1}')
    >>> raw[:24]
    b'{"x":1,"mac":"936c1779ac'
    >>> keys.open("demo", "a/b.json", raw)
    b'{"x":1}'
    >>> keys.open("demo", "a/c.json", raw)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    bootseer.sitekey.SealError: a/c.json: its MAC does not verify under the site key ...

A user-run command has no key (``None`` below): it writes records unsealed, which
root-run parts then refuse, and reads records without checking them (it trusts
nothing in them that it could not have written itself): :func:`seal_with` and
:func:`open_with`.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal, get_args

from bootseer.errors import ConfigError, StoreError
from bootseer.rootfile import read_root_only

if TYPE_CHECKING:
    from bootseer.config import SiteConfig

MIN_KEY = 16
SEAL_BYTES = 80  # what sealing adds to a record: read limits allow for it
MAX_KEY_FILE = 64 << 10
_LABEL = b"bootseer site subkey v1\0"
_TRAILER = re.compile(rb'(,?)"mac":"([0-9a-f]{64})"\}\Z')

# The purposes, one subkey each (a record sealed for one never opens as another).
Purpose = Literal[
    "deps.manifest",
    "deps.ref",
    "image.manifest",
    "image.name",
    "image.path",
    "image.trace",
    "ckpt.manifest",
    "phases.rows",
]
PURPOSES: tuple[Purpose, ...] = get_args(Purpose)
DEPS_MANIFEST: Final = "deps.manifest"
DEPS_REF: Final = "deps.ref"
IMAGE_MANIFEST: Final = "image.manifest"
IMAGE_NAME: Final = "image.name"
IMAGE_PATH: Final = "image.path"
IMAGE_TRACE: Final = "image.trace"
CKPT_MANIFEST: Final = "ckpt.manifest"
PHASES_ROWS: Final = "phases.rows"  # a whole Parquet file (bootseer.phases.seal)

# Records this process refused, by purpose (bootseer.metrics counts them: a node whose
# key differs from the others', or someone planting records, shows up there).
refused: collections.Counter[Purpose] = collections.Counter()
_refused_lock = threading.Lock()


def _refuse(purpose: Purpose, message: str) -> SealError:
    with _refused_lock:
        refused[purpose] += 1
    return SealError(message)


class SealError(StoreError):
    """A record is not sealed, or its MAC does not verify under any site key."""


class SiteKeys:
    """The site's keys, current first; ``missing`` says why there are none (then every
    :meth:`seal` and :meth:`open` raises :class:`SealError` saying so)."""

    def __init__(self, keys: Sequence[bytes], source: str = "", missing: str = "") -> None:
        if not keys and not missing:
            raise ValueError("SiteKeys needs at least one key or a reason there is none")
        for k in keys:
            if len(k) < MIN_KEY:
                raise ValueError(f"a site key of {len(k)} bytes; at least {MIN_KEY}")
        self.keys = tuple(keys)
        self.source = source
        self.missing = missing
        self._subkeys: dict[str, tuple[bytes, ...]] = {}

    def __repr__(self) -> str:
        if not self.keys:
            return f"SiteKeys(missing={self.missing!r})"
        return f"SiteKeys({len(self.keys)} keys from {self.source or '?'})"

    @property
    def current(self) -> bytes:
        self.require()
        return self.keys[0]

    def require(self) -> None:
        """Raise :class:`SealError` (saying why) unless there is a key to seal with."""
        if not self.keys:
            raise SealError(f"no site key, so no record can be sealed or verified: {self.missing}")

    def subkeys(self, purpose: Purpose) -> tuple[bytes, ...]:
        """The subkey of ``purpose`` under every key, current first."""
        self.require()
        got = self._subkeys.get(purpose)
        if got is None:
            label = _LABEL + purpose.encode()
            got = tuple(hmac.new(k, label, hashlib.sha256).digest() for k in self.keys)
            self._subkeys[purpose] = got
        return got

    def seal(self, purpose: Purpose, name: str, body: bytes) -> bytes:
        """``body`` (a JSON object's bytes) with a ``"mac"`` member for ``purpose`` at ``name``."""
        if not (body.startswith(b"{") and body.endswith(b"}")):
            raise ValueError("only a JSON object can be sealed")
        mac = _mac(self.subkeys(purpose)[0], name, body)
        sep = b"" if body == b"{}" else b","
        return body[:-1] + sep + b'"mac":"' + mac.hex().encode() + b'"}'

    def verifies(self, purpose: Purpose, name: str, raw: bytes) -> bool:
        """Whether :meth:`open` would take the record, counting no refusal (a copy kept
        aside is checked so; the reader that uses it opens it, and counts)."""
        body, mac = _split(raw)
        return mac is not None and any(
            hmac.compare_digest(_mac(sub, name, body), mac) for sub in self.subkeys(purpose)
        )

    def open(self, purpose: Purpose, name: str, raw: bytes) -> bytes:
        """The body of a record sealed for ``purpose`` at ``name``; else :class:`SealError`."""
        subkeys = self.subkeys(purpose)
        body, mac = _split(raw)
        if mac is None:
            raise _refuse(
                purpose, f"{name}: not sealed with the site key (written by someone without it)"
            )
        for sub in subkeys:
            if hmac.compare_digest(_mac(sub, name, body), mac):
                return body
        raise _refuse(
            purpose,
            f"{name}: its MAC does not verify under the site key "
            "(written by someone without it, altered, or moved)",
        )


def _mac(subkey: bytes, name: str, body: bytes) -> bytes:
    where = name.encode()
    return hmac.new(subkey, b"%d:" % len(where) + where + body, hashlib.sha256).digest()


def _split(raw: bytes) -> tuple[bytes, bytes | None]:
    """The body and MAC of a sealed record; ``(raw, None)`` for one without a trailer."""
    m = _TRAILER.search(raw)
    if m is None:
        return raw, None
    if not m.group(1):  # {"mac":"..."}: only the empty object seals to this
        if raw[: m.start()] != b"{":
            return raw, None
        return b"{}", bytes.fromhex(m.group(2).decode())
    return raw[: m.start()] + b"}", bytes.fromhex(m.group(2).decode())


def strip(raw: bytes) -> bytes:
    """A record's body without checking its MAC (for readers that trust nothing in it)."""
    return _split(raw)[0]


def seal_with(keys: SiteKeys | None, purpose: Purpose, name: str, body: bytes) -> bytes:
    """Sealed with ``keys``; unsealed with None (a user-run writer, which has no key)."""
    return body if keys is None else keys.seal(purpose, name, body)


def open_with(keys: SiteKeys | None, purpose: Purpose, name: str, raw: bytes) -> bytes:
    """Opened with ``keys`` (:class:`SealError` unless it verifies); with None, the body
    unchecked: only for a user-run reader that trusts nothing it could not write itself."""
    return strip(raw) if keys is None else keys.open(purpose, name, raw)


# -- the key file ------------------------------------------------------------------------


def read_key_file(path: Path) -> list[bytes]:
    """The keys in ``path``, current first; refused unless the file is root's alone."""
    try:
        raw = read_root_only(path, "site key file", MAX_KEY_FILE)
    except FileNotFoundError as exc:
        raise ConfigError(f"site key file {path}: {exc.strerror}") from None
    keys = [
        line.strip()
        for line in raw.splitlines()
        if line.strip() and not line.strip().startswith(b"#")
    ]
    if not keys:
        raise ConfigError(f"site key file {path} holds no key")
    for i, k in enumerate(keys):
        if len(k) < MIN_KEY:
            raise ConfigError(
                f"site key file {path}: key {i + 1} has {len(k)} bytes; at least {MIN_KEY}"
            )
    return keys


_cache: dict[Path, tuple[tuple[int, int, int], SiteKeys]] = {}
_cache_lock = threading.Lock()


def load_keys(path: Path) -> SiteKeys:
    """The keys in ``path``, read once and again only when the file changes (rotation
    needs no restart); a file that is missing or wrong gives keys that refuse everything,
    saying why."""
    try:
        st = os.stat(path)
        ident = (st.st_ino, st.st_mtime_ns, st.st_size)
    except OSError as exc:
        return SiteKeys((), missing=f"[site] key_file {path}: {exc.strerror}")
    with _cache_lock:
        hit = _cache.get(path)
        if hit is not None and hit[0] == ident:
            return hit[1]
    try:
        keys = SiteKeys(read_key_file(path), source=str(path))
    except ConfigError as exc:
        return SiteKeys((), missing=str(exc))
    with _cache_lock:
        _cache[path] = (ident, keys)
    return keys


def site_keys(cfg: SiteConfig) -> SiteKeys:
    """The site's keys, for a root-run part (strict: without a key it trusts nothing)."""
    return load_keys(cfg.site.key_file)


def keys_if_root(cfg: SiteConfig) -> SiteKeys | None:
    """For a command a person runs: the site's keys when it runs as root (an admin, whose
    records the root-run parts will trust), None for a user (no key: unsealed writes,
    unchecked reads). Root without a usable key file is an error, not a silent downgrade."""
    if os.geteuid() != 0:
        return None
    keys = site_keys(cfg)
    if not keys.keys:
        raise ConfigError(f"running as root but {keys.missing}")
    return keys
