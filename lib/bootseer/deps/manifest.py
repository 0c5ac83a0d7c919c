"""The snapshot manifest: what the archive holds and how to check it.

It names the archive object, lists its zstd frames (offset, length, uncompressed size,
digest of the compressed bytes) and every entry of the tar stream in order (name, type,
size, link target). Format 2 names frames by BLAKE3 (``blake3:<hex>``,
:mod:`bootseer.digest`); format 1, every snapshot captured before, by SHA-256 (bare
hex), and is restored as it is. A release before format 2 takes a format-2 manifest for
a broken one: it drops it, the job installs and its epilog captures anew (in format 1,
which this release restores). Restore trusts none of it blindly: it is parsed strictly
and held against limits before a byte of the archive is fetched, and the archive is held
against it while it is extracted.

    >>> m = Manifest(key="0" * 32, base="1" * 32, scope="user/ada", prefix="/tmp/v",
    ...              data="data-" + "2" * 16 + ".tar.zst", frames=[], entries=[])
    >>> Manifest.from_json(m.to_json(), max_bytes=1 << 20, max_files=10).prefix
    '/tmp/v'
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from bootseer import digest as digests
from bootseer import jsonlimits
from bootseer.deps.layout import is_data_name, is_key
from bootseer.errors import ManifestError

FORMAT = 2  # frames named by any digest (new ones: BLAKE3)
FORMAT_SHA256 = 1  # frames named by SHA-256 alone: what every release writes that knows no other
MAX_MANIFEST = 512 << 20
MAX_FRAME_BYTES = 64 << 20  # deps.max_frame_bytes's default
ENTRY_TYPES = ("f", "d", "l", "h")  # file, directory, symlink, hard link


@dataclass(frozen=True)
class Frame:
    offset: int  # in the archive object
    length: int  # compressed bytes
    raw: int  # uncompressed bytes
    digest: str  # of the compressed bytes (bootseer.digest)


@dataclass(frozen=True)
class Entry:
    name: str  # relative to the prefix
    type: str  # one of ENTRY_TYPES
    size: int = 0
    link: str = ""


@dataclass
class Manifest:
    key: str
    base: str
    scope: str
    prefix: str
    data: str  # archive object name, beside the manifest
    frames: list[Frame]
    entries: list[Entry]
    command: list[str] | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    user: str = ""
    job_id: int = 0
    node: str = ""
    skipped: list[str] = field(default_factory=list)  # sockets etc. left out at capture
    # The prefix's own mode at capture (a restore gives it back, less any write bits for
    # others); manifests from before it was recorded restore 0755.
    mode: int = 0o755

    @property
    def raw_bytes(self) -> int:
        return sum(f.raw for f in self.frames)

    @property
    def stored_bytes(self) -> int:
        return sum(f.length for f in self.frames)

    def to_json(self) -> bytes:
        d = asdict(self)
        sha256 = all(digests.algorithm(f.digest) == "sha256" for f in self.frames)
        d["format"] = FORMAT_SHA256 if sha256 else FORMAT
        d["frames"] = [[f.offset, f.length, f.raw, f.digest] for f in self.frames]
        d["entries"] = [[e.name, e.type, e.size, e.link] for e in self.entries]
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_json(
        cls,
        data: bytes,
        *,
        max_bytes: int,
        max_files: int,
        max_frame_bytes: int = MAX_FRAME_BYTES,
    ) -> Manifest:
        if len(data) > MAX_MANIFEST:
            raise ManifestError(f"manifest of {len(data)} bytes is larger than {MAX_MANIFEST}")
        try:
            d = jsonlimits.loads(data, max_bytes=MAX_MANIFEST, what="manifest")
        except ValueError as exc:
            raise ManifestError(f"manifest is not JSON: {exc}") from None
        try:
            return _parse(
                d, max_bytes=max_bytes, max_files=max_files, max_frame_bytes=max_frame_bytes
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"malformed manifest: {exc!r}") from None


def _str(d: dict[str, Any], name: str) -> str:
    v = d[name]
    if not isinstance(v, str):
        raise TypeError(f"{name} must be a string")
    return v


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{what} must be a non-negative integer, not {v!r}")
    return v


def _mode(v: Any) -> int:
    mode = _int(v, "mode")
    if not 0 <= mode <= 0o7777:
        raise ValueError(f"mode {mode!r} is not a file mode")
    return mode


def check_name(name: str) -> str:
    """A relative, normalized entry name: no leading '/', no '.', '..' or empty part."""
    if not isinstance(name, str) or not name or len(name) > 4096 or "\0" in name:
        raise ValueError(f"bad entry name {name!r}")
    if name.startswith("/") or any(p in ("", ".", "..") for p in name.split("/")):
        raise ValueError(f"entry name {name!r} is not relative and normalized")
    return name


def _parse(d: Any, *, max_bytes: int, max_files: int, max_frame_bytes: int) -> Manifest:
    form = d.get("format") if isinstance(d, dict) else None
    if form not in (FORMAT_SHA256, FORMAT):
        raise ManifestError(f"not a format-{FORMAT_SHA256} or format-{FORMAT} snapshot manifest")
    key, base, data = _str(d, "key"), _str(d, "base"), _str(d, "data")
    if not is_key(key) or not is_key(base):
        raise ValueError("key and base must be 32 hex digits")
    if not is_data_name(data):
        raise ValueError(f"data object name {data!r} is not data-<16 hex>.tar.zst")
    prefix = _str(d, "prefix")
    if not prefix.startswith("/") or ".." in prefix.split("/"):
        raise ValueError(f"prefix {prefix!r} is not absolute")
    frames = []
    offset = 0
    for i, raw in enumerate(d["frames"]):
        off, length, size, named = raw
        f = Frame(
            _int(off, "frame offset"),
            _int(length, "frame length"),
            _int(size, "frame size"),
            str(named),
        )
        if f.offset != offset or f.length == 0 or f.raw == 0 or not digests.valid(f.digest):
            raise ManifestError(f"frame {i} is not contiguous or lacks a checksum")
        if form == FORMAT_SHA256 and digests.algorithm(f.digest) != "sha256":
            raise ManifestError(f"frame {i} of a format-{FORMAT_SHA256} manifest is not SHA-256")
        if f.raw > max_frame_bytes:
            raise ManifestError(
                f"frame {i} unpacks to {f.raw} bytes, more than "
                f"deps.max_frame_bytes={max_frame_bytes}"
            )
        offset += f.length
        frames.append(f)
    entries = []
    names: set[str] = set()
    if len(d["entries"]) > max_files:
        raise ManifestError(
            f"snapshot has {len(d['entries'])} entries, more than deps.max_files={max_files}"
        )
    for raw in d["entries"]:
        name, typ, size, link = raw
        e = Entry(check_name(name), str(typ), _int(size, "entry size"), str(link))
        if e.type not in ENTRY_TYPES:
            raise ValueError(f"entry {e.name!r} has unknown type {e.type!r}")
        if e.name in names:
            raise ManifestError(f"entry {e.name!r} appears twice")
        names.add(e.name)
        entries.append(e)
    m = Manifest(
        key=key,
        base=base,
        scope=_str(d, "scope"),
        prefix=prefix.rstrip("/"),
        data=data,
        frames=frames,
        entries=entries,
        command=[str(a) for a in d["command"]] if d.get("command") is not None else None,
        inputs=dict(d.get("inputs") or {}),
        created=float(d.get("created") or 0),
        user=str(d.get("user", "")),
        job_id=int(d.get("job_id") or 0),
        node=str(d.get("node", "")),
        skipped=[str(s) for s in d.get("skipped") or []],
        mode=_mode(d.get("mode", 0o755)),
    )
    if m.raw_bytes > max_bytes:
        raise ManifestError(
            f"snapshot unpacks to {m.raw_bytes} bytes, more than deps.max_bytes={max_bytes}"
        )
    if sum(e.size for e in entries) > m.raw_bytes:
        raise ManifestError("entry sizes add up to more than the archive holds")
    return m
