"""bootseer.digest: BLAKE3 names new data, a bare 64-hex digest is SHA-256, as it was."""

from __future__ import annotations

import hashlib

import pytest

from bootseer import digest

DATA = b"the bytes a node checks"
SHA256 = hashlib.sha256(DATA).hexdigest()


def test_new_data_is_named_by_blake3_and_checked_by_it() -> None:
    d = digest.of(DATA)
    algorithm, hex_digits = digest.split(d)
    assert d.startswith("blake3:") and algorithm == "blake3" and len(hex_digits) == 64
    assert digest.valid(d) and digest.matches(DATA, d)
    assert not digest.matches(DATA + b"!", d)
    assert digest.join("blake3", hex_digits) == d and digest.encoded(d) == hex_digits
    # The same bytes, every input form the data path hands over.
    assert digest.of(bytearray(DATA)) == digest.of(memoryview(DATA)) == d


def test_a_bare_digest_is_sha256_as_every_store_wrote_it() -> None:
    assert digest.of(DATA, "sha256") == SHA256
    assert digest.valid(SHA256) and digest.algorithm(SHA256) == "sha256"
    assert digest.matches(DATA, SHA256) and not digest.matches(DATA[1:], SHA256)
    assert digest.join("sha256", SHA256) == SHA256 and digest.encoded(SHA256) == SHA256
    # Never reinterpreted: SHA-256's hex digits under BLAKE3's name do not match, nor
    # BLAKE3's bare.
    assert not digest.matches(DATA, "blake3:" + SHA256)
    assert not digest.matches(DATA, digest.encoded(digest.of(DATA)))


def test_an_unknown_algorithm_is_a_clear_error() -> None:
    newer = "blake4:" + "0" * 64
    assert not digest.valid(newer)
    with pytest.raises(digest.DigestError, match="names no hash this bootseer knows"):
        digest.matches(DATA, newer)
    with pytest.raises(digest.DigestError, match="sha256, blake3"):
        digest.split("sha512:" + "0" * 128)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "0" * 63,
        "0" * 65,
        "A" * 64,  # upper case: not the form bootseer writes
        "blake3:" + "0" * 63,
        "blake3:" + "g" * 64,
        "sha256:" + "0" * 64,  # SHA-256 has one name here: bare
        " " + "0" * 64,
        "0" * 64 + "\n",
        None,
        64,
    ],
)
def test_a_malformed_digest_is_refused(bad: object) -> None:
    assert not digest.valid(bad)
    with pytest.raises(digest.DigestError, match="is not a digest"):
        digest.split(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):  # DigestError is one: decoders catch it as such
        digest.matches(DATA, bad)  # type: ignore[arg-type]


def test_no_digest_is_longer_than_max_chars() -> None:
    assert max(len(digest.of(DATA, a)) for a in digest.ALGORITHMS) == digest.MAX_CHARS
