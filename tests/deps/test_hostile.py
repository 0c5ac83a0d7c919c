"""Hostile and broken snapshots: a clear error, nothing written outside the prefix,
and no trace of a half-restored prefix.

Each snapshot goes through the real path: a file store, zstd frames, the manifest,
parallel decode, and extraction in a child that dropped to an unprivileged user.
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import tarfile
from pathlib import Path

import pytest

from bootseer.deps.manifest import Entry
from bootseer.deps.restore import RestoreRequest, read_manifest, restore
from bootseer.errors import BootseerError, ManifestError
from bootseer.store import Store
from tests.sitekeys import KEYS

from .conftest import USER_A, entries_of, member, needs_root, publish, tar_bytes

pytestmark = pytest.mark.root

MB = 1 << 20
Members = list[tuple[tarfile.TarInfo, bytes | None]]
LIMITS = RestoreRequest("", 0, 0)  # the default max_bytes and max_files


def do_restore(
    store: Store,
    scratch: Path,
    members: Members,
    *,
    entries: list[Entry] | None = None,
    raw: bytes | None = None,
    max_bytes: int = LIMITS.max_bytes,
    max_files: int = LIMITS.max_files,
) -> Path:
    needs_root()
    prefix = scratch / "env"
    publish(
        store,
        raw if raw is not None else tar_bytes(members),
        entries if entries is not None else entries_of(members),
        prefix=str(prefix),
    )
    m, _ = read_manifest(store, "user/ada", "2" * 32, max_bytes=1 << 30, max_files=1000, keys=KEYS)  # type: ignore[misc]
    req = RestoreRequest(
        prefix=str(prefix),
        uid=USER_A,
        gid=USER_A,
        groups=[USER_A],
        link_roots=["/usr"],
        timeout=30,
        max_bytes=max_bytes,
        max_files=max_files,
    )
    restore(store, m, req)
    return prefix


def assert_nothing_left(scratch: Path) -> None:
    """Neither the prefix nor a temp dir of it remains, and nothing escaped."""
    left = sorted(p.name for p in scratch.iterdir() if p.name != "store")
    assert left == [], left


def rejects(
    store: Store,
    scratch: Path,
    members: Members,
    match: str,
    *,
    entries: list[Entry] | None = None,
    raw: bytes | None = None,
    max_bytes: int = LIMITS.max_bytes,
    max_files: int = LIMITS.max_files,
) -> None:
    with pytest.raises(BootseerError, match=match):
        do_restore(
            store,
            scratch,
            members,
            entries=entries,
            raw=raw,
            max_bytes=max_bytes,
            max_files=max_files,
        )
    assert_nothing_left(scratch)


def test_a_good_snapshot_restores_owned_by_the_user(store: Store, scratch: Path) -> None:
    members = [
        member("bin", tarfile.DIRTYPE, mode=0o755),
        member("bin/tool", data=b"#!/bin/sh\n", mode=0o755),
        member("bin/python", tarfile.SYMTYPE, link="/usr/bin/python3"),
        member("bin/again", tarfile.LNKTYPE, link="bin/tool", mode=0o755),
    ]
    prefix = do_restore(store, scratch, members)
    st = os.lstat(prefix / "bin" / "tool")
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (USER_A, 0o755)
    assert os.readlink(prefix / "bin" / "python") == "/usr/bin/python3"
    assert os.lstat(prefix).st_uid == USER_A
    assert os.stat(prefix / "bin" / "again").st_ino == st.st_ino


BENIGN = [Entry("escaped", "f", 1)]  # a manifest that hides what the archive holds


def test_absolute_path(store: Store, scratch: Path) -> None:
    hostile = [member(str(scratch / "escaped"), data=b"x")]
    rejects(store, scratch, hostile, "not relative")  # the manifest's own entry list
    rejects(store, scratch, hostile, "absolute path", entries=BENIGN)  # the archive
    assert not (scratch / "escaped").exists()


def test_dotdot(store: Store, scratch: Path) -> None:
    hostile = [member("a/../../escaped", data=b"x")]
    rejects(store, scratch, hostile, "not relative")
    rejects(store, scratch, hostile, r"'\.\.'", entries=BENIGN)


def test_symlink_leaving_the_prefix(store: Store, scratch: Path) -> None:
    rejects(store, scratch, [member("up", tarfile.SYMTYPE, link="../../etc")], "outside|leaves")
    rejects(store, scratch, [member("etc", tarfile.SYMTYPE, link="/etc")], "leaves the prefix")
    rejects(store, scratch, [member("x", tarfile.SYMTYPE, link="/usr/../etc/shadow")], "leaves")


def test_write_through_a_symlink_inside(store: Store, scratch: Path) -> None:
    """The data filter allows a link pointing inside; a member below it is still refused."""
    members = [
        member("real", tarfile.DIRTYPE, mode=0o755),
        member("alias", tarfile.SYMTYPE, link="real"),
        member("alias/file", data=b"x"),
    ]
    rejects(store, scratch, members, "below a symlink")


def test_hard_links_outside(store: Store, scratch: Path) -> None:
    rejects(store, scratch, [member("pw", tarfile.LNKTYPE, link="/etc/passwd")], "hard link")
    rejects(store, scratch, [member("pw", tarfile.LNKTYPE, link="../../etc/passwd")], "hard link")


@pytest.mark.parametrize("kind", [tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE])
def test_devices_and_fifos(store: Store, scratch: Path, kind: bytes) -> None:
    ti, _ = member("dev", kind)
    ti.devmajor, ti.devminor = 1, 3
    rejects(store, scratch, [(ti, None)], "special file|disagrees")


def test_setuid_and_setgid_bits_are_dropped(store: Store, scratch: Path) -> None:
    prefix = do_restore(store, scratch, [member("suid", data=b"x", mode=0o6777)])
    mode = os.lstat(prefix / "suid").st_mode
    assert not mode & (stat.S_ISUID | stat.S_ISGID | stat.S_IWOTH)


def test_size_bomb(store: Store, scratch: Path) -> None:
    rejects(store, scratch, [member("big", data=b"\0" * (2 * MB))], "max_bytes", max_bytes=MB)


def test_manifest_over_the_size_limit_is_refused_before_fetching(
    store: Store, scratch: Path
) -> None:
    publish(
        store,
        tar_bytes([member("a", data=b"x" * 1000)]),
        entries_of([member("a", data=b"x" * 1000)]),
        prefix=str(scratch / "env"),
    )
    with pytest.raises(ManifestError, match="max_bytes"):
        read_manifest(store, "user/ada", "2" * 32, max_bytes=100, max_files=10, keys=KEYS)


def test_file_count_bomb(store: Store, scratch: Path) -> None:
    members = [member(f"f{i}", data=b"") for i in range(50)]
    rejects(store, scratch, members, "max_files", max_files=10)


def test_truncated_archive(store: Store, scratch: Path) -> None:
    needs_root()
    prefix = scratch / "env"
    members = [member("a", data=os.urandom(300_000))]
    m = publish(store, tar_bytes(members), entries_of(members), prefix=str(prefix))
    key = f"deps/user/ada/{'2' * 32}/{m.data}"
    store.write_bytes(key, store.read_bytes(key)[:-100])
    with pytest.raises(BootseerError, match="truncated"):
        restore(store, m, RestoreRequest(prefix=str(prefix), uid=USER_A, gid=USER_A))
    assert_nothing_left(scratch)


def test_corrupted_frame(store: Store, scratch: Path) -> None:
    needs_root()
    prefix = scratch / "env"
    members = [member("a", data=os.urandom(300_000))]
    m = publish(store, tar_bytes(members), entries_of(members), prefix=str(prefix))
    key = f"deps/user/ada/{'2' * 32}/{m.data}"
    data = bytearray(store.read_bytes(key))
    data[m.frames[2].offset + 50] ^= 0xFF
    store.write_bytes(key, bytes(data))
    with pytest.raises(BootseerError, match="frame 2: checksum mismatch"):
        restore(store, m, RestoreRequest(prefix=str(prefix), uid=USER_A, gid=USER_A))
    assert_nothing_left(scratch)


def test_frame_lying_about_its_size(store: Store, scratch: Path) -> None:
    """A frame whose header declares more than the manifest: refused before decoding."""
    from dataclasses import replace

    from bootseer.deps.frames import decode_frame

    members = [member("a", data=b"\0" * 100_000)]
    m = publish(store, tar_bytes(members), entries_of(members), prefix=str(scratch / "env"))
    data = store.read_range(f"deps/user/ada/{'2' * 32}/{m.data}", 0, m.frames[0].length)
    with pytest.raises(ManifestError, match="header says"):
        decode_frame(data, replace(m.frames[0], raw=10), 0)


def test_manifest_disagreeing_with_the_archive(store: Store, scratch: Path) -> None:
    members = [member("a", data=b"abc"), member("b", data=b"def")]
    lie = [Entry("a", "f", 3), Entry("c", "f", 3)]
    rejects(store, scratch, members, "disagrees", entries=lie)
    rejects(store, scratch, members, "more entries than the manifest", entries=lie[:1])
    rejects(
        store,
        scratch,
        members[:1],
        "ends after 1 of",
        entries=[Entry("a", "f", 3)] * 1 + [Entry("b", "f", 0)],
    )


def test_garbage_instead_of_tar(store: Store, scratch: Path) -> None:
    rejects(
        store,
        scratch,
        [],
        "broken archive|disagrees|ends after",
        raw=os.urandom(10_000),
        entries=[Entry("a", "f", 1)],
    )


def test_prefix_that_exists_is_not_overwritten(store: Store, scratch: Path) -> None:
    needs_root()
    (scratch / "env").mkdir()
    (scratch / "env" / "keep").write_text("mine")
    os.chown(scratch / "env", USER_A, USER_A)
    with pytest.raises(BootseerError, match="not empty"):
        do_restore(store, scratch, [member("a", data=b"x")])
    assert (scratch / "env" / "keep").read_text() == "mine"
    assert sorted(p.name for p in scratch.iterdir()) == ["env", "store"]


def test_relative_link_to_an_allowed_absolute_link(store: Store, scratch: Path) -> None:
    """A venv's bin/python3 -> python -> /usr/bin/python3: allowed, as created."""
    members = [
        member("bin", tarfile.DIRTYPE, mode=0o755),
        member("bin/python", tarfile.SYMTYPE, link="/usr/bin/python3"),
        member("bin/python3", tarfile.SYMTYPE, link="python"),
        member("lib64", tarfile.SYMTYPE, link="bin"),
    ]
    prefix = do_restore(store, scratch, members)
    assert os.readlink(prefix / "bin" / "python3") == "python"


# The member writer (bootseer.deps.writer) and the filter's textual checks.


def test_a_name_twice_is_refused_not_replaced(store: Store, scratch: Path) -> None:
    """A second entry of a name would replace what was checked (a directory turned into
    a link out of the prefix, and later members written through it)."""
    twice = [
        member("lib", tarfile.DIRTYPE, mode=0o755),
        member("lib", tarfile.SYMTYPE, link="/usr/lib"),
    ]
    rejects(store, scratch, twice, "appears twice")
    rejects(store, scratch, [member("a", data=b"1"), member("a", data=b"2")], "appears twice")
    hard = [member("a", data=b"1"), member("b", data=b"2"), member("b", tarfile.LNKTYPE, link="a")]
    rejects(store, scratch, hard, "appears twice")


def test_modes_times_and_owner_of_every_kind(store: Store, scratch: Path) -> None:
    """Files keep their mode less setuid/setgid/group-other write, get their owner's
    rw; directories the umask's; mtimes are the archive's; the job's user owns all."""
    modes = {"x": 0o755, "r": 0o644, "w": 0o666, "o": 0o400, "e": 0o711, "s": 0o4755}
    members = [member("d", tarfile.DIRTYPE, mode=0o777)]
    members += [member(f"d/{n}", data=n.encode(), mode=m) for n, m in modes.items()]
    members += [member("d/link", tarfile.SYMTYPE, link="x")]
    for ti, _ in members:
        ti.mtime = 1_600_000_000
    prefix = do_restore(store, scratch, members)
    want = {"x": 0o755, "r": 0o644, "w": 0o644, "o": 0o600, "e": 0o711, "s": 0o755}
    for n, m in want.items():
        st = os.lstat(prefix / "d" / n)
        assert (stat.S_IMODE(st.st_mode), st.st_mtime, st.st_uid) == (m, 1_600_000_000, USER_A)
        assert (prefix / "d" / n).read_bytes() == n.encode()
    st = os.lstat(prefix / "d")
    assert (st.st_mtime, st.st_uid, st.st_mode & 0o022) == (1_600_000_000, USER_A, 0)
    assert os.lstat(prefix / "d" / "link").st_uid == USER_A


def test_a_file_without_its_directory_entry(store: Store, scratch: Path) -> None:
    """A capture of the names an install changed may hold a/b/c without a/ and a/b/."""
    prefix = do_restore(store, scratch, [member("a/b/c", data=b"x")])
    assert (prefix / "a" / "b" / "c").read_bytes() == b"x"
    assert os.lstat(prefix / "a" / "b").st_uid == USER_A


HOSTILE_FOR_THE_DATA_FILTER = [
    member("../up", data=b"x"),
    member("a/../../up", data=b"x"),
    member("l", tarfile.SYMTYPE, link="../../etc"),
    member("l", tarfile.SYMTYPE, link="a/../../etc"),
    member("l", tarfile.SYMTYPE, link="/etc/passwd"),
    member("h", tarfile.LNKTYPE, link="/etc/passwd"),
    member("h", tarfile.LNKTYPE, link="../x"),
    member("c", tarfile.CHRTYPE),
    member("b", tarfile.BLKTYPE),
    member("f", tarfile.FIFOTYPE),
]


@pytest.mark.parametrize("hostile", HOSTILE_FOR_THE_DATA_FILTER, ids=lambda m: m[0].name)
def test_the_filter_refuses_what_the_data_filter_refuses(
    hostile: tuple[tarfile.TarInfo, bytes | None], tmp_path: Path
) -> None:
    """The textual checks refuse each member tarfile's own data filter refuses."""
    from bootseer.deps.archive import SnapshotFilter, SnapshotRejected, entry_of

    ti, _ = hostile
    if hasattr(tarfile, "data_filter"):
        with pytest.raises(tarfile.FilterError):  # type: ignore[attr-defined]
            tarfile.data_filter(ti, str(tmp_path))  # type: ignore[attr-defined]
    e = entry_of(ti)
    flt = SnapshotFilter(
        [e] if e is not None else [], link_roots=["/usr"], max_bytes=1 << 20, max_files=10
    )
    with pytest.raises(SnapshotRejected):
        flt(ti)


def test_contents_across_the_stream_buffers(store: Store, scratch: Path) -> None:
    """File bytes read past tarfile's stream (bootseer.deps.archive._data_reader) land
    in the right files, whatever their sizes around the 10 KiB and 1 MiB buffers."""
    sizes = [0, 1, 511, 512, 513, 10_240, 10_241, (1 << 20) - 1, 1 << 20, (3 << 20) + 7, 5]
    members = [member(f"f{i}", data=os.urandom(n)) for i, n in enumerate(sizes)]
    prefix = do_restore(store, scratch, members)
    for ti, data in members:
        assert (prefix / ti.name).read_bytes() == data, ti.name


# The GNU tar extractor (bootseer.deps.gnutar): the header pass accepts only what a
# capture writes, so that it and tar cannot read one header two ways. Each archive
# goes through restore() as USER_A, as the ones above.


def _patched(raw: bytes, at: int, field: slice, value: bytes) -> bytes:
    """``raw`` with the header at byte ``at`` changed in ``field``, checksum kept valid."""
    block = bytearray(raw[at : at + 512])
    block[field] = value
    block[148:156] = b"        "
    block[148:156] = b"%06o\0 " % sum(block)
    return raw[:at] + bytes(block) + raw[at + 512 :]


def test_the_default_extractor_is_gnu_tar() -> None:
    from bootseer.deps import gnutar

    assert gnutar.gnu_tar() is not None  # Debian's tar is essential: every node has it
    assert RestoreRequest("", 0, 0).extractor == "tar"


def test_a_header_that_is_not_posix_ustar(store: Store, scratch: Path) -> None:
    """An old-GNU header's prefix field holds times; tarfile reads it as a name prefix,
    tar does not: the one name checked, another written."""
    members = [member("a", data=b"x")]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for ti, data in members:
            tf.addfile(ti, io.BytesIO(data or b""))
    rejects(store, scratch, members, "not POSIX ustar", raw=buf.getvalue())
    raw = _patched(tar_bytes(members), 0, slice(257, 265), b"ustar  \0")
    rejects(store, scratch, members, "not POSIX ustar", raw=raw)


@pytest.mark.parametrize(
    ("kind", "match"),
    [
        (b"\0", "not one a capture writes"),  # AREGTYPE: a name ending in '/' is a dir
        (b"7", "not one a capture writes"),  # contiguous file
        (b"g", "not one a capture writes"),  # a pax global header
        (b"L", "not one a capture writes"),  # GNU long name: names the next member
        (b"K", "not one a capture writes"),  # GNU long link name
        (b"S", "sparse files are not allowed"),  # old GNU sparse
        (b"V", "not one a capture writes"),  # volume label
    ],
)
def test_member_types_a_capture_never_writes(
    store: Store, scratch: Path, kind: bytes, match: str
) -> None:
    members = [member("a", data=b"x")]
    rejects(
        store, scratch, members, match, raw=_patched(tar_bytes(members), 0, slice(156, 157), kind)
    )


@pytest.mark.parametrize(
    ("pax", "match"),
    [
        ({"SCHILY.xattr.user.x": "1"}, "not one a capture writes"),
        ({"comment": "hi"}, "not one a capture writes"),
        ({"GNU.sparse.major": "1", "GNU.sparse.minor": "0"}, "sparse files are not allowed"),
    ],
)
def test_pax_keywords_a_capture_never_writes(
    store: Store, scratch: Path, pax: dict[str, str], match: str
) -> None:
    ti, data = member("a", data=b"x")
    ti.pax_headers = pax
    rejects(store, scratch, [(ti, data)], match)


def test_malformed_pax_records(store: Store, scratch: Path) -> None:
    ti, data = member("a" * 120, data=b"x")  # a long name: a pax header with its path
    raw = tar_bytes([(ti, data)])
    assert raw[156:157] == tarfile.XHDTYPE
    rec = raw[512:1024]
    length = rec.index(b" ")
    bad = raw[:512] + rec[: length - 1] + b"9" + rec[length:] + raw[1024:]  # lies about its length
    rejects(store, scratch, [(ti, data)], "malformed pax record", raw=bad)
    # The path twice: the pass and tar might each take another one.
    ti2, _ = member("b" * 120, data=b"x")
    ti2.pax_headers = {"path": "c" * 120}
    twice = tar_bytes([(ti2, b"x")]).replace(b"path=" + b"c" * 120, b"path=" + b"b" * 120)
    rejects(store, scratch, [(ti, data)], "pax|disagrees", raw=twice)


def test_a_header_with_a_bad_checksum(store: Store, scratch: Path) -> None:
    """tar would skip ahead to the next header it finds valid, one the pass never saw."""
    members = [member("a", data=b"x")]
    raw = bytearray(tar_bytes(members))
    raw[0] = ord("b")
    rejects(store, scratch, members, "checksum", raw=bytes(raw))


def test_a_size_in_base_256(store: Store, scratch: Path) -> None:
    members = [member("a", data=b"x")]
    raw = _patched(tar_bytes(members), 0, slice(124, 136), b"\x80" + bytes(10) + b"\x01")
    rejects(store, scratch, members, "not octal", raw=raw)


def test_a_symlink_with_data(store: Store, scratch: Path) -> None:
    """tarfile skips no data after a symlink, tar skips its size: a header hidden in it
    would be written by one and never seen by the other."""
    hidden = tar_bytes([member("evil", data=b"x")])[:1024]
    link = tar_bytes([member("l", tarfile.SYMTYPE, link="a")])[:512]
    raw = _patched(link, 0, slice(124, 136), b"%011o\0" % 1024) + hidden + bytes(10240)
    rejects(store, scratch, [member("l", tarfile.SYMTYPE, link="a")], "bytes of data", raw=raw)


def test_data_after_the_end(store: Store, scratch: Path) -> None:
    members = [member("a", data=b"x")]
    raw = tar_bytes(members)
    rejects(store, scratch, members, "data after the end", raw=raw + b"x")
    # A lone zero block and then a member: tar would stop (or go on with -i); refused.
    rejects(store, scratch, members, "data after the end", raw=raw[:1024] + bytes(512) + raw)


def test_an_archive_cut_inside_a_header(store: Store, scratch: Path) -> None:
    members = [member("a", data=b"x"), member("b", data=b"y")]
    raw = tar_bytes(members)
    rejects(store, scratch, members, "ends at byte|ends inside", raw=raw[: 1024 + 100])


def test_tar_options_from_the_environment_are_ignored(
    store: Store, scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TAR_OPTIONS in the prolog's environment (``--to-stdout``, ``--absolute-names``)
    would change what tar does with the checked stream."""
    monkeypatch.setenv("TAR_OPTIONS", "--to-stdout --absolute-names")
    prefix = do_restore(store, scratch, [member("a", data=b"x")])
    assert (prefix / "a").read_bytes() == b"x"


def _tree(top: Path) -> list[Entry]:
    (top / "d").mkdir(parents=True)
    (top / "d" / "f").write_bytes(b"abc")
    os.chmod(top / "d" / "f", 0o644)
    os.link(top / "d" / "f", top / "h")
    os.symlink("d/f", top / "l")
    return [
        Entry("d", "d"),
        Entry("d/f", "f", 3),
        Entry("h", "h", 0, "d/f"),
        Entry("l", "l", 0, "d/f"),
    ]


def _spoil(top: Path, how: str) -> None:
    f = top / "d" / "f"
    if how == "extra":
        (top / "extra").write_bytes(b"")
    elif how == "missing":
        (top / "l").unlink()
    elif how == "size":
        f.write_bytes(b"abcd")
    elif how == "target":
        (top / "l").unlink()
        os.symlink("/etc/passwd", top / "l")
    elif how == "setuid":
        os.chmod(f, 0o4755)
    elif how == "group-write":
        os.chmod(f, 0o664)
    elif how == "not-linked":
        (top / "h").unlink()
        (top / "h").write_bytes(b"abc")
    elif how == "type":
        f.unlink()
        f.mkdir()


@pytest.mark.parametrize(
    ("how", "match"),
    [
        ("extra", "does not hold"),
        ("missing", "3 of"),
        ("size", "4 bytes"),
        ("target", "symlink"),
        ("setuid", "filtered mode"),
        ("group-write", "filtered mode"),
        ("not-linked", "not a hard link"),
        ("type", "filtered mode|not a"),
    ],
)
def test_the_walk_after_tar_checks_the_tree_against_the_manifest(
    tmp_path: Path, how: str, match: str
) -> None:
    """Whatever tar wrote that the pass did not check (a difference in how the two read
    a header) is refused by the walk after it."""
    from bootseer.deps.gnutar import HeaderError, check_tree

    entries = _tree(tmp_path / "t")
    check_tree(str(tmp_path / "t"), entries)
    _spoil(tmp_path / "t", how)
    with pytest.raises(HeaderError, match=match):
        check_tree(str(tmp_path / "t"), entries)


def test_a_snapshot_captured_before_blake3_still_restores_and_is_checked(
    store: Store, scratch: Path
) -> None:
    """Format 1, what every snapshot was before: frames named by SHA-256 (bare hex). It
    restores as it is, and a damaged frame of it is caught by SHA-256."""
    import hashlib
    import json
    from dataclasses import replace

    from bootseer.deps.layout import SnapshotPaths
    from bootseer.sitekey import DEPS_MANIFEST, seal_with

    needs_root()
    prefix = scratch / "env"
    members = [member("a", data=os.urandom(200_000), mode=0o644)]
    m = publish(store, tar_bytes(members), entries_of(members), prefix=str(prefix))
    assert json.loads(m.to_json())["format"] == 2
    assert all(f.digest.startswith("blake3:") for f in m.frames)
    paths = SnapshotPaths("user/ada", m.key)
    archive = store.read_bytes(paths.data(m.data))
    frames = [
        replace(f, digest=hashlib.sha256(archive[f.offset : f.offset + f.length]).hexdigest())
        for f in m.frames
    ]
    old = replace(m, frames=frames)
    raw = old.to_json()
    assert json.loads(raw)["format"] == 1 and json.loads(raw)["frames"][0][3] == frames[0].digest
    store.write_bytes(paths.manifest, seal_with(KEYS, DEPS_MANIFEST, paths.manifest, raw))
    got, _ = read_manifest(store, "user/ada", m.key, max_bytes=1 << 30, max_files=10, keys=KEYS)  # type: ignore[misc]
    assert got.frames == frames
    req = RestoreRequest(prefix=str(prefix), uid=USER_A, gid=USER_A, timeout=30)
    restore(store, got, req)
    assert (prefix / "a").read_bytes() == members[0][1]
    shutil.rmtree(prefix)
    damaged = bytearray(archive)
    damaged[frames[1].offset + 20] ^= 0xFF
    store.write_bytes(paths.data(m.data), bytes(damaged))
    with pytest.raises(BootseerError, match="frame 1: checksum mismatch"):
        restore(store, got, req)
