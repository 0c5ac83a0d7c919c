"""The tests' site key: records the tests plant as a root-run writer would are sealed with
:data:`KEYS`; configs point ``[site] key_file`` at a file holding it (:func:`key_file`)."""

from __future__ import annotations

import os
from pathlib import Path

from bootseer.sitekey import SiteKeys

KEY = b"bootseer-test-site-key-0123456789abcdef"
KEYS = SiteKeys([KEY], source="tests")


def key_file(directory: Path, *keys: bytes, name: str = "site.key") -> Path:
    """A root-only key file in ``directory`` holding ``keys`` (default: :data:`KEY`)."""
    path = directory / name
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, b"".join(k + b"\n" for k in (keys or (KEY,))))
    finally:
        os.close(fd)
    return path
