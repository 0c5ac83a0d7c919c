"""One ``.prom`` file: written whole and atomically, read back bounded.

``prometheus_client.write_to_textfile`` renames into place too, but creates its
temporary file with ``open()``: its mode follows the process' umask (a hook under a
site's ``umask 077`` would leave a file node_exporter, not root, cannot read), and a
``chmod`` after the rename leaves a moment when it cannot. Here the temporary file is
made 0644 and synced before the rename (:func:`write_atomically`); the text is
``generate_latest``'s all the same::

    >>> write_textfile(Path("/var/lib/node_exporter/x.prom"), registry)  # doctest: +SKIP
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from bootseer import localrecord

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

MAX_BYTES = 1 << 20  # a file of ours is a few KiB; more is not ours to parse


def write_textfile(path: Path, registry: Collector) -> None:
    """Write ``registry``'s metrics to ``path`` (in a directory root owns), atomically."""
    from prometheus_client import generate_latest

    write_atomically(path, generate_latest(registry))  # type: ignore[arg-type]


def write_atomically(path: Path, data: bytes) -> None:
    """``data`` as ``path``, root's, 0644 whatever the umask, by a rename."""
    # Its temp file has a dot name, which node_exporter (it reads *.prom only) skips.
    localrecord.write_bytes(path, data, 0o644, sync=True)


def read_bounded(path: Path) -> str | None:
    """The text of ``path`` (never through a link); None if there is none. Raises
    ``ValueError`` past :data:`MAX_BYTES` or on bytes that are not UTF-8."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise ValueError(f"{path}: larger than {MAX_BYTES} bytes")
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not text: {exc}") from None
