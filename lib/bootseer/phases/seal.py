"""Sealed phase files: root's flushes and compaction seal each Parquet file they write,
and root's reports count a file only if its seal verifies.

A phase file is what a root-run part wrote (the prolog's and epilog's flushes,
``bootseer phase compact``); whoever else gets write access to the store could add
rows to another user's job (a node that was never hers) or alter them. So each file
carries a MAC under the site key (:mod:`bootseer.sitekey`, purpose ``phases.rows``,
bound to the file's store key) over all of its bytes, kept inside the file: the
Parquet footer's key-value metadata holds ``bootseer.seal`` =
``bootseer-seal:v1:<64 hex>``. The writer writes the file with 64 zeros there, computes
the MAC over those bytes and puts it in their place (the same length: nothing else
moves). A checker finds the last such value in the footer, counts the zeros in its
place and recomputes: no Parquet is parsed before the seal verifies, and any Parquet
reader still reads the file as it is::

    >>> from bootseer.sitekey import SiteKeys
    >>> import pyarrow as pa
    >>> keys = SiteKeys([b"k" * 32])
    >>> raw = seal_table(keys, "phases/day=2026-11-21/job=7/a.parquet", pa.table({"x": [1]}))
    >>> verdict(keys, "phases/day=2026-11-21/job=7/a.parquet", raw)
    'sealed'
    >>> verdict(keys, "phases/day=2026-11-21/job=8/a.parquet", raw)  # moved
    'altered'
    >>> verdict(None, "phases/day=2026-11-21/job=8/a.parquet", raw)  # no key: looks sealed
    'unchecked'

Without the key (a user's ``bootseer report``) a file can only be seen to carry a seal
or not: one without is not root's (every root-run writer seals), one with may be.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal

from bootseer.sitekey import PHASES_ROWS

if TYPE_CHECKING:
    import pyarrow as pa

    from bootseer.sitekey import SiteKeys

PURPOSE: Final = PHASES_ROWS
META_KEY = b"bootseer.seal"
MARK = b"bootseer-seal:v1:"
_ZEROS = b"0" * 64
_HEX = re.compile(rb"\A[0-9a-f]{64}\Z")

# sealed: the MAC verifies; unsealed: no seal at all (not written by a root-run part);
# altered: a seal that does not verify (written without the key, altered, or moved);
# unchecked: a seal, but no key to check it with; oversize: larger than a checker reads
# (MAX_FILE_BYTES: it holds the file in memory to parse only the bytes it checked).
Verdict = Literal["sealed", "unsealed", "altered", "unchecked", "oversize"]
MAX_FILE_BYTES = 2 << 30  # a compacted day of ~100M rows; the flushes' files are KiBs


def parquet_bytes(table: pa.Table, row_group_size: int = 64 * 1024) -> bytes:
    """``table`` as a zstd Parquet file, unsealed (a seal in its schema's metadata, from a
    sealed file it was read from, is not this file's: it goes)."""
    meta = table.schema.metadata
    if meta and META_KEY in meta:
        table = table.replace_schema_metadata({k: v for k, v in meta.items() if k != META_KEY})
    return _write(table, row_group_size)


def _write(table: pa.Table, row_group_size: int) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", row_group_size=row_group_size)
    return bytes(sink.getvalue())


def seal_table(keys: SiteKeys, key: str, table: pa.Table, row_group_size: int = 64 * 1024) -> bytes:
    """``table`` as a Parquet file sealed for store key ``key`` (raises
    :class:`bootseer.sitekey.SealError` without a key)."""
    subkey = keys.subkeys(PURPOSE)[0]
    meta = dict(table.schema.metadata or {})
    meta[META_KEY] = MARK + _ZEROS
    raw = bytearray(_write(table.replace_schema_metadata(meta), row_group_size))
    at = _seal_at(raw)
    if at is None:
        raise AssertionError("pyarrow wrote no key-value metadata for the seal")
    raw[at : at + 64] = _mac(subkey, key, raw, at).hex().encode()
    return bytes(raw)


def verdict(keys: SiteKeys | None, key: str, raw: bytes | bytearray | memoryview) -> Verdict:
    """What the seal of file ``raw`` at store key ``key`` says; with ``keys`` None only
    whether it carries one."""
    at = _seal_at(raw)
    if at is None:
        return "unsealed"
    if keys is None:
        return "unchecked"
    mac = bytes(raw[at : at + 64])
    if not _HEX.match(mac):
        return "altered"
    want = bytes.fromhex(mac.decode())
    for sub in keys.subkeys(PURPOSE):
        if hmac.compare_digest(_mac(sub, key, raw, at), want):
            return "sealed"
    return "altered"


def _seal_at(raw: bytes | bytearray | memoryview) -> int | None:
    """Where the seal's 64 hex digits sit in the footer, or None for a file without one
    (or not Parquet at all)."""
    data = memoryview(raw)
    n = len(data)
    if n < 12 or bytes(data[-4:]) != b"PAR1":
        return None
    footer = int.from_bytes(data[-8:-4], "little")
    start = n - 8 - footer
    if footer <= 0 or start < 4:
        return None
    at = bytes(data[start : n - 8]).rfind(MARK)
    if at < 0 or start + at + len(MARK) + 64 > n - 8:
        return None
    return start + at + len(MARK)


def _mac(subkey: bytes, key: str, raw: bytes | bytearray | memoryview, at: int) -> bytes:
    """The MAC of ``raw`` at store key ``key`` with zeros in place of its 64 digits at ``at``
    (framed as :mod:`bootseer.sitekey` frames a record: the key's length, the key, the body)."""
    data = memoryview(raw)
    where = key.encode()
    h = hmac.new(subkey, b"%d:" % len(where) + where, hashlib.sha256)
    h.update(data[:at])
    h.update(_ZEROS)
    h.update(data[at + 64 :])
    return h.digest()


@dataclass
class Tally:
    """What reads found of the files' seals, file by file.

    ``checked``: a key was there to check them (root's reports): a file whose seal does
    not verify, or that has none, is *refused* (not counted). Without a key (a user's
    report, or root's where the key file is missing: ``unchecked_why``), a file without
    a seal is counted but *unsealed* (shown as such), one with a seal *unchecked*.
    """

    checked: bool
    unchecked_why: str = ""
    sealed: set[str] = field(default_factory=set)  # store keys whose seal verified
    unchecked: set[str] = field(default_factory=set)  # with a seal no key could check
    unsealed: dict[str, int] = field(default_factory=dict)  # without one, counted: rows
    refused: dict[str, Verdict] = field(default_factory=dict)  # not counted: why
    refused_rows: dict[str, int] = field(default_factory=dict)  # as their footers say

    def count(self, key: str, v: Verdict, rows: int = 0) -> None:
        if v == "sealed":
            self.sealed.add(key)
        elif v == "unchecked":
            self.unchecked.add(key)
        elif v == "unsealed" and not self.checked:
            self.unsealed[key] = rows
        else:
            self.refused[key] = v
            self.refused_rows[key] = rows

    @property
    def rows_refused(self) -> int:
        return sum(self.refused_rows.values())

    @property
    def rows_unsealed(self) -> int:
        return sum(self.unsealed.values())

    def copy(self) -> Tally:
        return Tally(
            self.checked,
            self.unchecked_why,
            set(self.sealed),
            set(self.unchecked),
            dict(self.unsealed),
            dict(self.refused),
            dict(self.refused_rows),
        )

    def to_json(self) -> dict[str, object]:
        return {
            "checked": self.checked,
            "unchecked_why": self.unchecked_why or None,
            "files_sealed": len(self.sealed),
            "files_unchecked": len(self.unchecked),
            "files_unsealed_counted": len(self.unsealed),
            "rows_unsealed_counted": self.rows_unsealed,
            "files_refused": len(self.refused),
            "rows_refused": self.rows_refused,
            "refused": [{"key": k, "why": v} for k, v in sorted(self.refused.items())],
            "unsealed": sorted(self.unsealed),
        }
