"""The manifest of one version of a striped file: the last thing written, the commit.

A manifest is a small JSON object under the file's key on the first target::

    {"format": 1, "version": "20261121T101500-3f2a9c1e0b7d", "size": 20971520,
     "unit_size": 8388608, "checksum": "blake3",
     "targets": ["file:///a", "file:///b"],
     "units": [["0", "blake3:<hex>"], ["1", "blake3:<hex>"], ["2", "blake3:<hex>"]]}

``checksum`` names the hash of every unit's digest (:mod:`bootseer.digest`): ``blake3``
for what is written now, each unit's digest in its named form; ``sha256`` for what was
written before BLAKE3 (bare hex), read and checked as it is. One hash per version: an
update of a SHA-256 version copies none of its units into the new one (it rewrites them,
hashed anew). A release before BLAKE3 refuses a ``blake3`` manifest by its checksum.

Unit ``i`` lives on ``targets[i % len(targets)]`` under ``units/<version>/<name>``;
its length follows from ``size`` and ``unit_size``. A name is the index, or
``<index>.<generation>`` for a last partial unit committed by an ``fsync`` before the
writer went on (a later commit writes the full unit under a new name, so a committed
manifest never points at an object that is rewritten).

A symbolic link is the object ``{"format": 1, "symlink": "<relative target>"}`` under
its name's key (:class:`Symlink`, :func:`parse_node`): committed the same way, sealed the
same way, its target checked by :func:`bootseer.ckpt.names.check_link`.

Manifests come from users' namespaces and are read by root: :func:`parse` checks
every field and refuses targets the site config does not list.

    >>> m = Manifest(version=new_version(), size=3, unit_size=4, targets=("file:///t",),
    ...              units=(("0", unit_checksum(b"abc")),))
    >>> parse(m.to_json(), allowed_targets={"file:///t"}) == m
    True
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass

from bootseer import digest as digests
from bootseer import jsonlimits
from bootseer.errors import ManifestError

FORMAT = 1
CHECKSUM: digests.Algorithm = digests.CURRENT  # the hash new units are named by
MAX_UNIT_SIZE = 1 << 30
MAX_MANIFEST_BYTES = 64 << 20
MAX_TARGETS = 256
_VERSION = re.compile(r"^[0-9]{8}T[0-9]{6}-[0-9a-f]{12}$")
_UNIT_NAME = re.compile(r"^([0-9]{1,12})(\.[0-9]{1,9})?$")


def unit_checksum(data: bytes | bytearray | memoryview) -> str:
    """The digest a new unit is named by."""
    return digests.of(data, CHECKSUM)


def new_version() -> str:
    """A fresh version id: sortable by time, unique by its random part."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class Manifest:
    version: str
    size: int
    unit_size: int
    targets: tuple[str, ...]
    units: tuple[tuple[str, str], ...]  # (name, digest) per unit, in order
    mtime: float = 0.0  # seconds since the epoch when the version was committed

    @property
    def checksum(self) -> digests.Algorithm:
        """The hash the units' digests are made by (one per version; :func:`parse`)."""
        return digests.algorithm(self.units[0][1]) if self.units else CHECKSUM

    @property
    def unit_count(self) -> int:
        return -(-self.size // self.unit_size)

    def unit_length(self, index: int) -> int:
        return min(self.unit_size, self.size - index * self.unit_size)

    def target_of(self, index: int) -> str:
        return self.targets[index % len(self.targets)]

    def to_json(self) -> bytes:
        doc = {
            "format": FORMAT,
            "version": self.version,
            "size": self.size,
            "unit_size": self.unit_size,
            "checksum": self.checksum,
            "targets": list(self.targets),
            "units": [list(u) for u in self.units],
            "mtime": self.mtime,
        }
        return json.dumps(doc, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Symlink:
    """A relative symbolic link inside the namespace (``latest -> checkpoint-1200``)."""

    target: str
    mtime: float = 0.0

    @property
    def size(self) -> int:
        return len(self.target.encode())

    def to_json(self) -> bytes:
        doc = {"format": FORMAT, "symlink": self.target, "mtime": self.mtime}
        return json.dumps(doc, separators=(",", ":")).encode()


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise ManifestError(f"bad manifest: {what}")


def parse(raw: bytes, allowed_targets: set[str] | frozenset[str]) -> Manifest:
    """Check and decode a manifest; ``allowed_targets`` are the site's target URIs."""
    node = parse_node(raw, allowed_targets)
    _need(isinstance(node, Manifest), "a symbolic link, not a file")
    assert isinstance(node, Manifest)
    return node


def parse_node(raw: bytes, allowed_targets: set[str] | frozenset[str]) -> Manifest | Symlink:
    """Check and decode what a name's key holds: a file's manifest or a symbolic link."""
    from bootseer.ckpt.errors import CkptPathError
    from bootseer.ckpt.names import check_link_text

    _need(len(raw) <= MAX_MANIFEST_BYTES, f"larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        doc = jsonlimits.loads(raw, max_bytes=MAX_MANIFEST_BYTES, what="manifest")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ManifestError(f"bad manifest: not JSON ({exc})") from None
    _need(isinstance(doc, dict), "not an object")
    _need(doc.get("format") == FORMAT, f"format {doc.get('format')!r}, this reader knows {FORMAT}")
    if "symlink" in doc:
        target, mtime = doc["symlink"], doc.get("mtime", 0.0)
        _need(isinstance(target, str), "symlink target")
        _need(isinstance(mtime, int | float), "mtime")
        try:
            check_link_text(target)
        except CkptPathError as exc:
            raise ManifestError(f"bad manifest: {exc}") from None
        return Symlink(target, float(mtime))
    version, size, unit_size = doc.get("version"), doc.get("size"), doc.get("unit_size")
    _need(isinstance(version, str) and bool(_VERSION.match(version)), f"version {version!r}")
    _need(type(size) is int and size >= 0, f"size {size!r}")
    _need(type(unit_size) is int and 0 < unit_size <= MAX_UNIT_SIZE, f"unit_size {unit_size!r}")
    checksum = doc.get("checksum")
    _need(checksum in digests.ALGORITHMS, f"checksum {checksum!r}, not one of {digests.ALGORITHMS}")
    targets = doc.get("targets")
    _need(isinstance(targets, list) and 0 < len(targets) <= MAX_TARGETS, "targets")
    for t in targets:
        _need(isinstance(t, str), "targets")
        if t not in allowed_targets:
            raise ManifestError(
                f"manifest names target {t!r}, which is not in the site config's [ckpt] targets"
            )
    units = doc.get("units")
    count = -(-size // unit_size)
    _need(isinstance(units, list) and len(units) == count, f"want {count} units")
    out = []
    for i, u in enumerate(units):
        _need(isinstance(u, list) and len(u) == 2, f"unit {i}")
        name, digest = u
        m = _UNIT_NAME.match(name) if isinstance(name, str) else None
        _need(m is not None and int(m.group(1)) == i, f"unit {i} name {name!r}")
        _need(digests.valid(digest) and digests.algorithm(digest) == checksum, f"unit {i} checksum")
        out.append((name, digest))
    mtime = doc.get("mtime", 0.0)
    _need(isinstance(mtime, int | float), "mtime")
    return Manifest(
        version=version,
        size=size,
        unit_size=unit_size,
        targets=tuple(targets),
        units=tuple(out),
        mtime=float(mtime),
    )
