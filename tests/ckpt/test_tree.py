"""The rename table (issue 23): a directory renamed by one write, whatever it holds."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import trio

from bootseer.ckpt import CkptIOError, Namespace
from bootseer.ckpt.listing import list_path
from bootseer.ckpt.manifest import Manifest, Symlink
from bootseer.ckpt.tree import Tree, parse_tree
from bootseer.ckptd.fs import CkptFS
from bootseer.errors import ManifestError
from bootseer.store import open_store

from .conftest import UNIT


def _put(ns: Namespace, path: str, data: bytes) -> None:
    with ns.open(path, "wb") as f:
        f.write(data)


def _read(ns: Namespace, path: str) -> bytes:
    with ns.open(path) as f:
        return f.read()


def test_a_directory_rename_is_one_write_of_the_table(ns: Namespace, tmp_path: Path) -> None:
    for i in range(50):
        _put(ns, f"tmp/sub/f{i}", b"x%d" % i)
    meta = Path(tmp_path / "t0")  # the first target holds manifests and the table
    before = sorted(p for p in meta.rglob("*") if p.is_file())
    ns.rename_dir("tmp", "ckpt")
    after = sorted(p for p in meta.rglob("*") if p.is_file())
    assert set(after) - set(before) == {meta / "ada/test/tree.json"}
    assert [e.name for e in ns.listdir()] == ["ckpt"]
    assert _read(ns, "ckpt/sub/f7") == b"x7"
    assert ns.manifest("tmp/sub/f7") is None and not ns.is_dir("tmp")
    assert sorted(ns.walk()) == sorted(f"ckpt/sub/f{i}" for i in range(50))
    # Another process (another node) reads the same table.
    other = Namespace(ns.targets, "ada/test", unit_size=UNIT)
    assert _read(other, "ckpt/sub/f3") == b"x3"


def _rename_halfway(lister: Namespace, writer: Namespace, after: int) -> None:
    """Another node renames ``tmp`` to ``ckpt`` while ``lister`` reads the manifests of a
    listing of ``tmp``: once it has read ``after`` of them."""
    looks = 0
    node = lister.node

    def node_then_rename(path: str, *tree: Tree) -> Manifest | Symlink | None:
        nonlocal looks
        looks += 1
        if looks == after:
            writer.rename_dir("tmp", "ckpt")
        return node(path, *tree)

    lister.node = node_then_rename  # type: ignore[method-assign,assignment]


def test_a_listing_is_of_one_rename_table(ns: Namespace) -> None:
    """A rename committed by another node while this one lists the directory: the daemon's
    readdir and ``bootseer ckpt ls`` list the directory as it was, all of it, not the
    entries read before the rename (the table read again halfway cut the rest)."""
    for i in range(10):
        _put(ns, f"tmp/f{i}", b"x")
    want = [f"f{i}" for i in range(10)]
    lister = Namespace(ns.targets, "ada/test", unit_size=UNIT)
    lister.tree_ttl = 0  # every look reads the table, as one that expires halfway
    _rename_halfway(lister, ns, after=4)
    fs = CkptFS(lister, 0, 0)
    fh = trio.run(fs.opendir, fs._ino("tmp"), None)  # type: ignore[arg-type]
    assert [name for name, _, _ in fs._dirs[fh]] == want

    ns.rename_dir("ckpt", "tmp")
    lister = Namespace(ns.targets, "ada/test", unit_size=UNIT)
    lister.tree_ttl = 0
    _rename_halfway(lister, ns, after=4)
    entries, more = list_path(lister, "tmp")
    assert ([e.name for e in entries], more) == (want, 0)


def test_a_reader_keeps_the_version_it_opened(ns: Namespace) -> None:
    _put(ns, "tmp/a", b"a" * (3 * UNIT))
    with ns.open("tmp/a") as f:
        ns.rename_dir("tmp", "ckpt")
        assert f.read() == b"a" * (3 * UNIT)


def test_the_name_renamed_away_can_be_made_again(ns: Namespace) -> None:
    _put(ns, "tmp/a", b"1")
    ns.rename_dir("tmp", "ckpt-1")
    ns.mkdir("tmp")
    assert ns.listdir("tmp") == []
    _put(ns, "tmp/a", b"2")
    ns.rename_dir("tmp", "ckpt-2")
    assert (_read(ns, "ckpt-1/a"), _read(ns, "ckpt-2/a")) == (b"1", b"2")
    ns.remove("ckpt-1/a")
    ns.rmdir("ckpt-1")
    assert [e.name for e in ns.listdir()] == ["ckpt-2"]
    with pytest.raises(OSError) as e:
        ns.rename_dir("ckpt-2", "ckpt-2/in")
    assert e.value.errno == errno.EINVAL


def test_a_table_that_does_not_verify_is_an_io_error(ns: Namespace, tmp_path: Path) -> None:
    _put(ns, "tmp/a", b"1")
    ns.rename_dir("tmp", "ckpt")
    (tmp_path / "t0/ada/test/tree.json").write_text('{"format": 1, "dirs": {"x": "../../etc"}}')
    ns.tree_ttl = 0
    with pytest.raises(CkptIOError, match="rename table"):
        ns.manifest("ckpt/a")


@pytest.mark.parametrize(
    "doc",
    [
        '{"format": 1, "dirs": {"a": "/etc"}}',
        '{"format": 1, "dirs": {"a": "files/../x"}}',
        '{"format": 1, "dirs": {"../a": "files/a"}}',
        '{"format": 1, "dirs": {"a": "dirs/zz"}}',
        '{"format": 2, "dirs": {}}',
    ],
)
def test_bad_tables_are_refused(doc: str) -> None:
    with pytest.raises(ManifestError):
        parse_tree(doc.encode())


def test_tree_resolution() -> None:
    t = Tree().renamed("a/b", "c", "files/a/b")
    assert t.resolve("c/x") == "files/a/b/x" and t.resolve("a/b/x") is None
    assert t.shows("a", "b") is False and t.extra_dirs("") == ["c"]
    back = t.renamed("c", "a/b", "files/a/b")
    assert back.resolve("a/b/x") == "files/a/b/x" and back.resolve("c") is None
    assert parse_tree(t.to_json()) == t


def test_unsealed_table_is_refused_by_a_keyed_reader(targets: list[str], tmp_path: Path) -> None:
    from tests.sitekeys import KEYS

    user = Namespace([open_store(u) for u in targets], "ada/test", unit_size=UNIT)
    _put(user, "tmp/a", b"1")
    user.rename_dir("tmp", "ckpt")  # a user's own process: unsealed
    root = Namespace([open_store(u) for u in targets], "ada/test", unit_size=UNIT, keys=KEYS)
    with pytest.raises(CkptIOError, match="rename table"):
        root.listdir()


def test_a_file_or_link_made_where_a_directory_was_renamed_away(ns: Namespace) -> None:
    _put(ns, "tmp/a", b"1")
    ns.rename_dir("tmp", "ckpt")
    _put(ns, "tmp", b"a file now")  # its old place is ckpt's: a fresh one
    assert _read(ns, "tmp") == b"a file now" and _read(ns, "ckpt/a") == b"1"
    assert [(e.name, e.is_dir) for e in ns.listdir()] == [("ckpt", True), ("tmp", False)]
    ns.rename("tmp", "tmp2")
    assert [e.name for e in ns.listdir()] == ["ckpt", "tmp2"]
    ns.symlink("tmp", "ckpt")
    assert [(e.name, e.is_dir) for e in ns.listdir()] == [
        ("ckpt", True),
        ("tmp", False),
        ("tmp2", False),
    ]
    ns.remove("tmp")
    ns.remove("tmp2")
    assert [e.name for e in ns.listdir()] == ["ckpt"]
    ns.remove("ckpt/a")
    ns.rmdir("ckpt")
    assert ns.listdir() == [] and ns.tree(fresh=True).dirs == {}


def test_verify_checks_files_and_passes_over_links(ns: Namespace) -> None:
    from bootseer.ckpt.actions import verify

    _put(ns, "ckpt-1/a", b"x" * (2 * UNIT))
    ns.symlink("latest", "ckpt-1")
    reply = verify(ns, "")
    assert reply.problems == [] and reply.files == 2 and reply.bytes == 2 * UNIT
