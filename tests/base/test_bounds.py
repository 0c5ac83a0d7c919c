"""Bounded parsers (issue 11): whatever a user can put into the store, a spool or a
socket, a root-run parser answers with its own error, never a RecursionError, and never
allocates what a document merely declares.

A document nested 100,000 deep made ``json.loads`` raise RecursionError, which no
parser caught: it broke every job of a shared image (trace), killed the ckpt FUSE
daemon (ckpt manifest) and the prolog's restore (deps manifest, ref).
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
import zstandard

from bootseer import jsonlimits
from bootseer.agent.restart import RestartState
from bootseer.ckpt.manifest import parse as parse_ckpt
from bootseer.config import SiteConfig
from bootseer.deps.frames import decode_frame
from bootseer.deps.layout import SnapshotPaths, ref_path
from bootseer.deps.manifest import Frame
from bootseer.deps.manifest import Manifest as DepsManifest
from bootseer.deps.restore import find_snapshot, read_manifest
from bootseer.errors import ConfigError, ManifestError
from bootseer.image.manifest import Manifest, load_manifest, manifest_key
from bootseer.image.registry import lookup_name, name_key, path_key, register_path
from bootseer.image.trace import load_trace, trace_key
from bootseer.p2p.wire import PeerError, read_message
from bootseer.phases.spool import Spool
from bootseer.store import Store

DEEP = b"[" * 100_000 + b"]" * 100_000
DEEP_OBJ = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
BS = 64 << 10


def test_the_helper_refuses_depth_and_size_but_not_brackets_in_strings() -> None:
    for doc in (DEEP, DEEP_OBJ):
        with pytest.raises(jsonlimits.JSONLimitError, match="deeper than"):
            jsonlimits.loads(doc)
        with pytest.raises(ValueError):  # what every parser already catches
            jsonlimits.loads(doc)
    names = ["a" + "[" * 40 + "b", 'q\\"' + "[" * 40, "\\" + "{" * 40]
    assert jsonlimits.loads(json.dumps({"names": names}).encode()) == {"names": names}
    with pytest.raises(jsonlimits.JSONLimitError, match="larger than 10"):
        jsonlimits.loads(b"[1, 2, 3, 4, 5]", max_bytes=10)
    assert jsonlimits.loads(b"[" * 32 + b"]" * 32) is not None
    with pytest.raises(jsonlimits.JSONLimitError):
        jsonlimits.loads(b"[" * 33 + b"]" * 33)


# The parsers' limits hold for every reader; a root-run reader checks the site key's MAC
# first (tests/base/test_sitekey.py), so these read unchecked (keys=None) to reach them.


def image(store: Store) -> Manifest:
    m = Manifest(size=3 * BS, block_size=BS, blocks=("a" * 64, "b" * 64, "c" * 64))
    store.write_bytes(manifest_key(m.id), m.to_json())
    return m


def test_a_deeply_nested_trace_is_ignored_not_fatal(store: Store) -> None:
    m = image(store)
    store.write_bytes(trace_key(m.id, "alice"), DEEP_OBJ)
    said: list[str] = []
    assert load_trace(store, m, said.append, keys=None, user="alice") is None
    assert "deeper than" in said[0]


def test_a_deeply_nested_image_manifest_or_record_is_a_manifest_error(store: Store) -> None:
    m = image(store)
    store.write_bytes(manifest_key(m.id), DEEP)
    with pytest.raises(ManifestError):
        load_manifest(store, m.id, keys=None)
    store.write_bytes(name_key("pytorch:1"), DEEP_OBJ)
    with pytest.raises(ManifestError, match="damaged"):
        lookup_name(store, "pytorch:1", keys=None)


def test_a_deeply_nested_path_record_is_registered_over(store: Store, tmp_path: Path) -> None:
    f = tmp_path / "x.sqsh"
    f.write_bytes(b"hsqs" + b"x" * (2 * BS))
    store.write_bytes(path_key(str(f)), DEEP_OBJ)
    got = register_path(store, str(f), f.stat(), BS, 5, keys=None)
    assert got.size == f.stat().st_size


def test_a_deeply_nested_deps_manifest_or_ref_is_a_manifest_error(store: Store) -> None:
    scope, key = "user/ada", "2" * 32
    store.write_bytes(SnapshotPaths(scope, key).manifest, DEEP)
    with pytest.raises(ManifestError):
        read_manifest(store, scope, key, max_bytes=1 << 30, max_files=1000, keys=None)
    store.write_bytes(ref_path(scope, "3" * 32), DEEP_OBJ)
    with pytest.raises(ManifestError):
        find_snapshot(store, scope, "3" * 32, keys=None)


def deps_manifest(raw: int, data: bytes) -> bytes:
    import hashlib

    return DepsManifest(
        key="2" * 32,
        base="3" * 32,
        scope="user/ada",
        prefix="/tmp/env",
        data="data-" + "0" * 16 + ".tar.zst",
        frames=[Frame(0, len(data), raw, hashlib.sha256(data).hexdigest())],
        entries=[],
    ).to_json()


def test_a_frame_declaring_more_than_max_frame_bytes_is_refused_unread(store: Store) -> None:
    """Within deps.max_bytes but one frame of 1 GiB: a node would hold it whole. The
    manifest is refused before any frame is fetched, and decoding refuses it too."""
    bomb = zstandard.ZstdCompressor(write_content_size=True).compress(b"\0" * (96 << 20))
    raw = deps_manifest(96 << 20, bomb)
    scope, key = "user/ada", "2" * 32
    store.write_bytes(SnapshotPaths(scope, key).manifest, raw)
    with pytest.raises(ManifestError, match="max_frame_bytes"):
        read_manifest(store, scope, key, max_bytes=64 << 30, max_files=1000, keys=None)
    assert read_manifest(
        store, scope, key, max_bytes=64 << 30, max_files=1000, max_frame_bytes=128 << 20, keys=None
    )
    m = DepsManifest.from_json(raw, max_bytes=64 << 30, max_files=10, max_frame_bytes=1 << 30)
    with pytest.raises(ManifestError, match="max_frame_bytes"):
        decode_frame(bomb, m.frames[0], 0, max_raw=64 << 20)


def test_max_frame_bytes_is_a_site_setting() -> None:
    assert SiteConfig.from_mapping({"deps": {"max_frame_bytes": 16 << 20}}).deps.max_frame_bytes
    with pytest.raises(ConfigError, match="max_frame_bytes"):
        SiteConfig.from_mapping({"deps": {"max_frame_bytes": 1 << 20, "frame_bytes": 8 << 20}})


def test_a_deeply_nested_ckpt_manifest_is_a_manifest_error() -> None:
    with pytest.raises(ManifestError):
        parse_ckpt(DEEP_OBJ, frozenset({"file:///t0"}))


def test_a_deeply_nested_mark_is_an_unreadable_line(tmp_path: Path) -> None:
    spool = Spool.at(tmp_path)
    good = json.dumps({"event": "start", "phase": "x", "t": time.time()})
    spool.marks_path.write_bytes(DEEP + b"\n" + good.encode() + b"\n")
    _events, problems = spool.marks(1 << 20)
    assert any("unreadable" in p for p in problems)


def test_a_deeply_nested_restart_state_is_dropped(tmp_path: Path) -> None:
    said: list[str] = []
    state = RestartState(tmp_path / "jobs", said.append)
    (tmp_path / "jobs" / "7.json").write_bytes(DEEP_OBJ)
    assert list(state.load()) == []
    assert not (tmp_path / "jobs" / "7.json").exists()


def test_a_deeply_nested_peer_message_is_a_protocol_error() -> None:
    import struct

    a, b = socket.socketpair()
    try:
        body = b"[" * 2000 + b"]" * 2000  # within MAX_HEADER, past the recursion limit
        a.sendall(struct.pack(">I", len(body)) + body)
        with pytest.raises(PeerError):
            read_message(b, time.monotonic() + 5)
    finally:
        a.close()
        b.close()
