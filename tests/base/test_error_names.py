"""One name per error: what the techniques raise for one concept is one class, or kinds
of one base in bootseer.errors that a caller catches across techniques."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from bootseer.ckpt.errors import CkptError, CkptQuotaExceeded
from bootseer.ckpt.manifest import parse as parse_ckpt_manifest
from bootseer.ckpt.quota import QuotaGuard, Scope
from bootseer.deps.capture import CaptureError, SnapshotQuotaExceeded
from bootseer.deps.manifest import Manifest as SnapshotManifest
from bootseer.errors import ManifestError, QuotaExceeded, StepError, StoreError
from bootseer.image.manifest import Manifest as ImageManifest
from bootseer.store import open_store


def test_a_bad_manifest_is_one_error_whichever_technique_reads_it() -> None:
    for read in (
        lambda: parse_ckpt_manifest(b"{", frozenset()),
        lambda: SnapshotManifest.from_json(b"{", max_bytes=1 << 20, max_files=10),
        lambda: ImageManifest.from_json(b"{"),
    ):
        with pytest.raises(ManifestError) as info:
            read()
        assert type(info.value) is ManifestError
        assert isinstance(info.value, StoreError)


def test_a_quota_is_caught_across_techniques_and_keeps_its_kind(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}")
    store.write_bytes("ada/run/units/v/0", b"x" * 60)
    guard = QuotaGuard([store], [Scope("user", "ada", 64, ("ada",))])
    with pytest.raises(QuotaExceeded) as info:
        guard.charge(5, "ada/run:model.pt")
    # A checkpoint write's: EDQUOT to file-object callers, and a checkpoint error.
    assert isinstance(info.value, CkptQuotaExceeded) and isinstance(info.value, CkptError)
    assert isinstance(info.value, OSError) and info.value.errno == errno.EDQUOT
    assert str(info.value).startswith("ada/run:model.pt: 5 B more would pass")
    # A snapshot capture's: a step error (the epilog skips the capture).
    assert issubclass(SnapshotQuotaExceeded, QuotaExceeded)
    assert issubclass(SnapshotQuotaExceeded, CaptureError)
    assert issubclass(SnapshotQuotaExceeded, StepError)
