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
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

MAX_BYTES = 1 << 20  # a file of ours is a few KiB; more is not ours to parse


def write_textfile(path: Path, registry: Collector) -> None:
    """Write ``registry``'s metrics to ``path`` (in a directory root owns), atomically."""
    from prometheus_client import generate_latest

    write_atomically(path, generate_latest(registry))  # type: ignore[arg-type]


def write_atomically(path: Path, data: bytes) -> None:
    """``data`` as ``path``, root's, 0644 whatever the umask, by a rename."""
    # mkstemp: O_EXCL (never through a planted link); a dot name that node_exporter,
    # which reads *.prom only, skips.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.rename(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        Path(tmp).unlink(missing_ok=True)
        raise


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
