"""Files only root may read (the site key, the store's secrets): opened and checked once.

>>> read_root_only(Path("/etc/bootseer/site.key"), "site key file", 1 << 16)  # doctest: +SKIP
b'6f1c...'
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from bootseer.errors import ConfigError


def root_only(st: os.stat_result) -> bool:
    """A regular file owned by root that no one else may read or write."""
    return stat.S_ISREG(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o077


def read_root_only(path: Path, what: str, limit: int, hint: str = "") -> bytes:
    """``path``'s bytes, at most ``limit``, through one descriptor opened without following
    a link; ConfigError (naming ``what``) unless the file is root's alone.
    FileNotFoundError passes through: a missing file means different things to callers."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ConfigError(f"{what} {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not root_only(st):
            raise ConfigError(
                f"{what} {path} must be a regular file owned by root with mode 0600 "
                f"(it is uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}){hint}"
            )
        raw = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(raw) > limit:
        raise ConfigError(f"{what} {path} is larger than {limit} bytes")
    return raw
