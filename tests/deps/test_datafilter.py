"""bootseer's copy of tarfile's ``data`` filter (for Debian bookworm's Python 3.11.2).

The hostile-snapshot tests in tests/deps run with both filters; here the copy is
held to tarfile's own answers member by member, and a restore runs on Debian's own
interpreter when the machine has one older than 3.11.4.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
import textwrap
from pathlib import Path

import pytest

from bootseer.deps import datafilter

TOP = Path(__file__).resolve().parents[2]
DEBIAN_PYTHON = Path("/usr/bin/python3")


def member(
    name: str, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, link: str = ""
) -> tarfile.TarInfo:
    m = tarfile.TarInfo(name)
    m.type, m.mode, m.linkname = kind, mode, link
    m.uid, m.gid, m.uname, m.gname = 1234, 99, "eve", "wheel"
    return m


MEMBERS = [
    member("bin/tool", mode=0o4755),
    member("bin/setgid", mode=0o2775),
    member("data", mode=0o666),
    member("noexec", mode=0o070),
    member("private", mode=0o000),
    member("/abs/name"),
    member("../escape"),
    member("a/../../escape"),
    member("dir", tarfile.DIRTYPE, mode=0o1777),
    member("lib/link", tarfile.SYMTYPE, link="../bin/tool"),
    member("lib/up", tarfile.SYMTYPE, link="../../etc/passwd"),
    member("lib/abs", tarfile.SYMTYPE, link="/etc/passwd"),
    member("hard", tarfile.LNKTYPE, link="bin/tool"),
    member("hard-out", tarfile.LNKTYPE, link="../etc/shadow"),
    member("hard-abs", tarfile.LNKTYPE, link="/etc/shadow"),
    member("dev", tarfile.CHRTYPE),
    member("blk", tarfile.BLKTYPE),
    member("fifo", tarfile.FIFOTYPE),
]
ATTRS = ("name", "mode", "uid", "gid", "uname", "gname", "linkname", "type")


@pytest.mark.skipif(not datafilter.NATIVE, reason="this Python has no tarfile data filter")
@pytest.mark.parametrize("m", MEMBERS, ids=[m.name for m in MEMBERS])
def test_the_copy_answers_as_tarfile_does(
    m: tarfile.TarInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def answer() -> tuple[object, ...] | str:
        try:
            got = datafilter.data_filter(m, str(tmp_path))
        except datafilter.FilterError:
            return "refused"
        return tuple(getattr(got, a) for a in ATTRS)

    native = answer()
    monkeypatch.setattr(datafilter, "NATIVE", False)
    assert answer() == native


RESTORE = textwrap.dedent(
    """
    import io, os, sys, tarfile
    from bootseer.deps import datafilter
    from bootseer.deps.archive import SnapshotRejected, entry_of, extract_snapshot

    assert not datafilter.NATIVE, sys.version
    def tar(members):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
            for m, data in members:
                tf.addfile(m, io.BytesIO(data) if data is not None else None)
        return buf.getvalue()
    def m(name, kind=tarfile.REGTYPE, mode=0o644, link="", data=None):
        t = tarfile.TarInfo(name)
        t.type, t.mode, t.linkname = kind, mode, link
        if data is not None:
            t.size = len(data)
        return t, data
    def restore(members, prefix):
        r, w = os.pipe()
        os.write(w, tar(members)); os.close(w)
        entries = [entry_of(t) for t, _ in members]
        return extract_snapshot(r, prefix, entries, raw_bytes=0, link_roots=["/usr"],
                                max_bytes=1 << 20, max_files=100)
    top = sys.argv[1]
    good = [m("bin", tarfile.DIRTYPE, 0o755), m("bin/tool", mode=0o4755, data=b"#!/bin/sh\\n"),
            m("bin/python", tarfile.SYMTYPE, link="/usr/bin/python3"),
            m("bin/again", tarfile.LNKTYPE, 0o755, link="bin/tool")]
    got = restore(good, top + "/env")
    st = os.stat(top + "/env/bin/tool")
    print("restored", got["entries"], oct(st.st_mode & 0o7777), st.st_nlink,
          os.readlink(top + "/env/bin/python"))
    for name, bad in [("up", [m("up", tarfile.SYMTYPE, link="../../etc")]),
                      ("fifo", [m("fifo", tarfile.FIFOTYPE)]),
                      ("hard", [m("h", tarfile.LNKTYPE, link="../etc/shadow")])]:
        try:
            restore(bad, top + "/" + name)
        except SnapshotRejected as exc:
            print("rejected", name, os.path.exists(top + "/" + name))
        else:
            print("accepted", name)
    """
)


def debian_python_without_filter() -> bool:
    if not DEBIAN_PYTHON.exists():
        return False
    r = subprocess.run(
        [str(DEBIAN_PYTHON), "-c", "import tarfile; print(hasattr(tarfile, 'data_filter'))"],
        capture_output=True,
        text=True,
    )
    return r.stdout.strip() == "False"


@pytest.mark.skipif(
    not debian_python_without_filter(), reason="no interpreter without tarfile's data filter here"
)
def test_a_restore_on_debians_own_python(tmp_path: Path) -> None:
    # Debian bookworm's 3.11.2: TarFile.extract() took no filter= and every restore failed.
    r = subprocess.run(
        [str(DEBIAN_PYTHON), "-c", RESTORE, str(tmp_path)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(TOP / "lib"), "PATH": os.environ["PATH"]},
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "restored 4 0o755 2 /usr/bin/python3", lines
    assert lines[1:] == ["rejected up False", "rejected fifo False", "rejected hard False"]
