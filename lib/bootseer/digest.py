"""Digests of the bytes a node receives, serves and checks: named, in OCI's form.

A digest says which hash made it, as OCI's ``algorithm:encoded``: what bootseer names
now is ``blake3:<64 hex>``; a bare ``<64 hex>`` is SHA-256, the one form bootseer wrote
before, so every store, cache and manifest written so far stays readable and checkable
as it is (old data is never reinterpreted: a bare digest is never taken for BLAKE3)::

    >>> of(b"abc")
    'blake3:6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85'
    >>> matches(b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    True
    >>> valid("sha512:" + "0" * 64), algorithm("blake3:" + "0" * 64)
    (False, 'blake3')
    >>> try:
    ...     matches(b"abc", "md5:900150983cd24fb0d6963f7d28e17f72")
    ... except DigestError as exc:
    ...     print(exc)
    digest 'md5:900150983cd24fb0...' names no hash this bootseer knows (sha256, blake3)

Why BLAKE3: hashing on receipt was most of the peer receiver's CPU and the checkpoint
daemon's (docs/performance.md, issue 19). Here, one core, a 256 KiB block: BLAKE3
(the ``blake3`` package, the BLAKE3 team's binding) 0.11 CPU-s per GiB, SHA-256 with
the CPU's SHA instructions 0.54. It is a cryptographic hash, so a peer that lies is still
caught. Both release the GIL while they hash inputs above a few KiB (hashlib above 2 KiB,
the binding above its own threshold): a hashing thread does not stop the process's
others. The binding's own threads are not used (``max_threads`` stays 1): a node's
cores are the job's.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable
from typing import Any, Final, Literal

from bootseer.errors import BootseerError

Algorithm = Literal["sha256", "blake3"]
ALGORITHMS: Final[tuple[Algorithm, ...]] = ("sha256", "blake3")
CURRENT: Final[Algorithm] = "blake3"  # what new data is named by
# The one pattern of a digest: an optional known algorithm, 64 lowercase hex digits.
_FORM = re.compile(r"(?:(blake3):)?([0-9a-f]{64})")
MAX_CHARS: Final = len("blake3:") + 64  # the longest digest any algorithm here makes

Data = bytes | bytearray | memoryview


class DigestError(BootseerError, ValueError):
    """Not a digest, or one made by a hash this bootseer does not know (a newer
    release's): the data it names cannot be checked here."""


def of(data: Data, algorithm: Algorithm = CURRENT) -> str:
    """The digest of ``data`` by ``algorithm`` (BLAKE3 unless told), in its named form."""
    if algorithm == "blake3":
        hex_digits: str = _blake3()(data).hexdigest()
        return "blake3:" + hex_digits
    return hashlib.sha256(data).hexdigest()


@functools.cache
def _blake3() -> Callable[[Data], Any]:
    """The binding, imported when first hashed with: a restore also runs on a bare
    interpreter with this library alone (Debian's python3, tests/deps/test_datafilter.py),
    and SHA-256 data needs nothing more."""
    from blake3 import blake3

    return blake3


def valid(digest: object) -> bool:
    """Whether ``digest`` is a digest this bootseer can check (a bare 64-hex SHA-256 or
    ``blake3:<64 hex>``): what every decoder of a digest from elsewhere asks first."""
    return isinstance(digest, str) and _FORM.fullmatch(digest) is not None


def split(digest: str) -> tuple[Algorithm, str]:
    """``(algorithm, hex)`` of a digest; :class:`DigestError` if it is none this
    bootseer can check (an unknown algorithm said so by name)."""
    m = _FORM.fullmatch(digest) if isinstance(digest, str) else None
    if m is None:
        raise DigestError(_why(digest))
    return ("blake3" if m.group(1) else "sha256"), m.group(2)


def join(algorithm: Algorithm, hex_digits: str) -> str:
    """The named form of ``hex_digits`` made by ``algorithm`` (:func:`split`'s inverse)."""
    digest = hex_digits if algorithm == "sha256" else f"{algorithm}:{hex_digits}"
    if not valid(digest):
        raise DigestError(_why(digest))
    return digest


def algorithm(digest: str) -> Algorithm:
    return split(digest)[0]


def encoded(digest: str) -> str:
    """A digest's hex digits without its algorithm: what a job's nodes spread pieces by
    (owners, peers asked), alike for every algorithm."""
    return digest.rpartition(":")[2]


def matches(data: Data, digest: str) -> bool:
    """Whether ``data`` has ``digest``, by the hash the digest names."""
    return of(data, algorithm(digest)) == digest


def _why(digest: object) -> str:
    shown = repr(digest[:20] + "..." if isinstance(digest, str) and len(digest) > 20 else digest)
    name, colon, _ = digest.partition(":") if isinstance(digest, str) else ("", "", "")
    if colon and name.isalnum() and name not in ALGORITHMS:
        return f"digest {shown} names no hash this bootseer knows ({', '.join(ALGORITHMS)})"
    return f"{shown} is not a digest (64 hex digits, or blake3: and 64 hex digits)"
