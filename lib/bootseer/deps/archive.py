"""The tar side of a snapshot: write one from a prefix, extract one into a prefix.

Both run in a child with the job user's rights (:mod:`bootseer.asuser`), so the
kernel already keeps them inside what the user may read and write. Extraction keeps
the rules of tarfile's ``data`` filter (PEP 706): no ``..`` escapes, no links leaving
the destination, no device nodes or FIFOs, no setuid/setgid/sticky, no ownership
(the modes come from :func:`bootseer.deps.datafilter.filtered_mode`). tarfile parses
the headers; :class:`~bootseer.deps.writer.MemberWriter` writes the members, in
fewer system calls than tarfile's ``extract``, and the filter checks paths by their
text instead of resolving them on disk (see :meth:`SnapshotFilter.__call__`).
:class:`SnapshotFilter` adds what it does not cover:

- absolute member names are refused (the data filter would quietly strip the '/');
- no member may sit below a symlink of the same archive (no writing through links);
- a hard link must name a regular file the archive already holds;
- sparse members are refused;
- entry and byte counts are held to the site's limits (file-count and size bombs);
- every member must match the manifest's entry at the same position, and the
  archive must hold exactly the manifest's entries;
- absolute symlinks are allowed only into the site's ``deps.link_roots`` (a venv's
  ``bin/python`` points at its interpreter); relative ones must stay inside;
- no name may appear twice (a second one would replace what was checked).

    >>> SnapshotFilter([], link_roots=["/usr"], max_bytes=1, max_files=1).count
    0
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from typing import Any, Literal

from bootseer.asuser import stop_held
from bootseer.deps import datafilter, gnutar, oldtree
from bootseer.deps.manifest import Entry, check_name
from bootseer.deps.writer import CHUNK, MemberWriter, WriteError
from bootseer.errors import BootseerError, describe

Extractor = Literal["tar", "python"]
"""Who writes a restore's members: GNU tar fed checked headers, or tarfile."""


class SnapshotRejected(BootseerError):
    """The archive is hostile or broken; nothing of it was kept."""


def entry_of(member: tarfile.TarInfo) -> Entry | None:
    if member.isreg():
        return Entry(member.name, "f", member.size)
    if member.isdir():
        return Entry(member.name, "d")
    if member.issym():
        return Entry(member.name, "l", 0, member.linkname)
    if member.islnk():
        return Entry(member.name, "h", 0, member.linkname)
    return None


class SnapshotFilter:
    """A tarfile extraction filter: the ``data`` filter plus the checks above."""

    def __init__(
        self, entries: Sequence[Entry], *, link_roots: Sequence[str], max_bytes: int, max_files: int
    ) -> None:
        self.entries = entries
        self.link_roots = [r.rstrip("/") or "/" for r in link_roots]
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.count = 0
        self.bytes = 0
        self._symlinks: set[str] = set()
        self._files: set[str] = set()

    def __call__(self, member: tarfile.TarInfo) -> int | None:
        """Check ``member``; return the mode to give it (None: the umask's), or
        :class:`SnapshotRejected`.

        The ``data`` filter's rules, checked on the names' text: the filter resolves the
        member's path and link on disk (two ``realpath`` walks, about 15 ``lstat`` each),
        which here can find nothing the text does not say. The directory is fresh and
        only this extraction writes it; every name has no ``..`` or empty part, none is
        absolute, none lies below a symlink of the archive, none is written twice
        (:class:`~bootseer.deps.writer.MemberWriter`), and a hard link names a regular
        file before it. So every path stays inside, and nothing is written through a link.
        """
        name = member.name
        where = f"entry {self.count} ({name!r})"
        if name.startswith("/"):
            raise SnapshotRejected(f"{where}: absolute path")
        try:
            check_name(name.rstrip("/") if member.isdir() else name)
        except ValueError:
            raise SnapshotRejected(f"{where}: '.', '..' or empty part in the path") from None
        self.count += 1
        if self.count > self.max_files:
            raise SnapshotRejected(f"more than deps.max_files={self.max_files} entries")
        if member.issparse():
            raise SnapshotRejected(f"{where}: sparse files are not allowed")
        symlinks = self._symlinks
        if symlinks:
            cut = name.find("/")
            while cut > 0:
                if name[:cut] in symlinks:
                    raise SnapshotRejected(f"{where}: lies below a symlink of the archive")
                cut = name.find("/", cut + 1)
        if member.isreg():
            self.bytes += member.size
            if self.bytes > self.max_bytes:
                raise SnapshotRejected(f"more than deps.max_bytes={self.max_bytes} bytes of files")
        elif member.islnk():
            if member.linkname not in self._files:
                raise SnapshotRejected(
                    f"{where}: hard link to {member.linkname!r}, not a file earlier in the archive"
                )
        elif member.issym():
            self._check_symlink(member, where)
        try:
            mode = datafilter.filtered_mode(member)
        except datafilter.FilterError as exc:
            raise SnapshotRejected(f"{where}: {exc}") from None
        got = entry_of(member)
        want = self.entries[self.count - 1] if self.count <= len(self.entries) else None
        if want is None:
            raise SnapshotRejected(f"{where}: the archive holds more entries than the manifest")
        if got != want:
            raise SnapshotRejected(
                f"{where}: the archive disagrees with the manifest (archive {got}, manifest {want})"
            )
        if member.issym():
            symlinks.add(name.rstrip("/"))
        elif member.isreg():
            self._files.add(name)
        return mode

    def _check_symlink(self, member: tarfile.TarInfo, where: str) -> None:
        # Symlinks are checked by their text, not by resolving them on disk as the data
        # filter does: a relative link may point at another link (python3 -> python ->
        # /usr/bin/python3.11), and nothing is ever written through a link (see above).
        link = member.linkname
        if "\0" in link:
            raise SnapshotRejected(f"{where}: NUL in the symlink's target")
        if link.startswith("/"):
            target = os.path.normpath(link)
            if ".." in link.split("/") or not any(
                r == "/" or target == r or target.startswith(r + "/") for r in self.link_roots
            ):
                raise SnapshotRejected(
                    f"{where}: symlink to {link!r} leaves the prefix "
                    f"(allowed outside it: deps.link_roots={self.link_roots})"
                )
        else:
            target = os.path.normpath(os.path.join(os.path.dirname(member.name), link))
            if target == ".." or target.startswith("../") or not link:
                raise SnapshotRejected(f"{where}: symlink to {link!r} leaves the prefix")

    def finish(self) -> None:
        if self.count != len(self.entries):
            raise SnapshotRejected(
                f"the archive ends after {self.count} of the manifest's {len(self.entries)} entries"
            )


def extract_snapshot(
    in_fd: int,
    prefix: str,
    entries: Sequence[Entry],
    *,
    raw_bytes: int,
    link_roots: Sequence[str],
    max_bytes: int,
    max_files: int,
    replace: bool = False,
    mode: int = 0o755,
    extractor: Extractor = "tar",
) -> dict[str, Any]:
    """Extract the tar stream on ``in_fd`` into ``prefix``, whole or not at all.

    ``extractor="tar"``: GNU tar writes the members, each header checked and rewritten
    first (:mod:`bootseer.deps.gnutar`); where the node has no GNU tar, or with
    ``"python"``, tarfile parses and :class:`~bootseer.deps.writer.MemberWriter` writes.

    The stream goes into a fresh sibling directory, which is renamed onto ``prefix``
    only once every entry checked out; ``prefix`` must not exist or be empty, unless
    ``replace`` (the caller knows it holds an earlier restore): then the old tree is
    renamed aside (:func:`bootseer.deps.oldtree.set_aside`: the job's epilog deletes it)
    and the new one into place. ``prefix`` gets
    ``mode`` (the captured prefix's), never group or other write, always the owner's rwx.
    """
    parent, name = os.path.split(prefix.rstrip("/"))
    os.makedirs(parent, mode=0o755, exist_ok=True)
    # Checked again now that every directory above exists: the prolog's check ran before
    # the frames were fetched, and a directory another user made meanwhile on the way
    # (makedirs keeps it) would let her swap what is restored here.
    from bootseer.deps.prefix import unsafe_reason

    unsafe = unsafe_reason(os.path.normpath(prefix), os.geteuid())
    if unsafe:
        raise SnapshotRejected(f"not restoring into {prefix}: {unsafe}")
    vfs = os.statvfs(parent)
    if vfs.f_bavail * vfs.f_frsize < raw_bytes:
        raise SnapshotRejected(
            f"{parent}: {vfs.f_bavail * vfs.f_frsize} bytes free, the snapshot needs {raw_bytes}"
        )
    tmp = tempfile.mkdtemp(prefix=oldtree.extraction_mark(name), dir=parent)
    try:
        flt = SnapshotFilter(
            entries, link_roots=link_roots, max_bytes=max_bytes, max_files=max_files
        )
        tar = gnutar.gnu_tar() if extractor == "tar" else None
        if tar is not None:
            try:
                gnutar.extract(in_fd, tmp, flt, tar)
            except gnutar.HeaderError as exc:
                raise SnapshotRejected(f"broken archive after entry {flt.count}: {exc}") from None
            flt.finish()
            try:
                gnutar.check_tree(tmp, entries)
            except gnutar.HeaderError as exc:
                raise SnapshotRejected(f"the extracted tree disagrees: {exc}") from None
        else:
            _extract_python(in_fd, tmp, flt)
        os.chmod(tmp, prefix_mode(mode))
        try:
            os.rename(tmp, prefix)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            if not replace:
                raise SnapshotRejected(f"{prefix} exists and is not empty") from None
            # Aside, not deleted: the job's epilog removes it (bootseer.deps.oldtree).
            oldtree.set_aside(prefix)
            os.rename(tmp, prefix)
    except BaseException:
        with stop_held():
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    st = os.lstat(prefix)
    return {"entries": flt.count, "bytes": flt.bytes, "dev": st.st_dev, "ino": st.st_ino}


def _extract_python(in_fd: int, tmp: str, flt: SnapshotFilter) -> None:
    """tarfile parses, :class:`~bootseer.deps.writer.MemberWriter` writes (where GNU
    tar is not there, or ``extractor="python"``)."""
    # Buffered: tarfile's stream reads 10 KiB at a time, one system call each without it.
    with open(in_fd, "rb", buffering=1 << 20, closefd=False) as reader:
        try:
            with tarfile.open(fileobj=reader, mode="r|", errorlevel=2) as tf:
                _extract_members(tf, flt, MemberWriter(tmp))
        except tarfile.TarError as exc:
            raise SnapshotRejected(
                f"broken archive after entry {flt.count}: {describe(exc)}"
            ) from None
        flt.finish()
        while chunk := reader.read(1 << 20):
            if chunk.count(0) != len(chunk):
                raise SnapshotRejected("data after the end of the archive")


def _extract_members(tf: tarfile.TarFile, flt: SnapshotFilter, out: MemberWriter) -> None:
    """Every member of ``tf`` (a stream) through ``flt`` and into ``out``, in order."""
    read = _data_reader(tf)
    try:
        while (member := tf.next()) is not None:
            mode = flt(member)
            try:
                _write(out, member, mode, read)
            except FileNotFoundError:
                # A capture of some names (what an install changed) may hold a file
                # without its directory: make the directories on the way, as tar does.
                # Each part was checked (no '..', no symlink of the archive above it).
                path = os.path.join(out.dest, member.name.rstrip("/"))
                os.makedirs(os.path.dirname(path), exist_ok=True)
                _write(out, member, mode, read)
        out.finish()
    except WriteError as exc:
        raise SnapshotRejected(f"entry {flt.count - 1}: {exc}") from None


def _data_reader(tf: tarfile.TarFile) -> Callable[[int], bytes | memoryview]:
    """``read(n)``: up to ``n`` bytes of the current member's data, as tarfile's stream
    would return them, without its copies: the stream reads 10 KiB at a time and joins
    them (about 100 calls and two copies per MiB). What it holds already comes first;
    the rest is read straight into one buffer, and the stream's offset kept right, so
    its next header read (and its skip of the padding) start where they must."""
    stream: Any = tf.fileobj
    raw: Any = getattr(stream, "fileobj", None)
    if not (isinstance(getattr(stream, "buf", None), bytes) and hasattr(raw, "readinto")):
        return stream.read  # type: ignore[no-any-return]  # not the stream this knows
    buf = memoryview(bytearray(CHUNK))

    def read(n: int) -> bytes | memoryview:
        held: bytes = stream.buf
        if held:
            data: bytes | memoryview = held[:n]
            stream.buf = held[n:]
        else:
            data = buf[: raw.readinto(buf[: min(n, CHUNK)]) or 0]
        stream.pos += len(data)
        return data

    return read


def _write(
    out: MemberWriter,
    member: tarfile.TarInfo,
    mode: int | None,
    read: Callable[[int], bytes | memoryview],
) -> None:
    name = member.name.rstrip("/")
    if member.isreg():
        assert mode is not None
        out.file(name, member.size, mode, int(member.mtime), read)
    elif member.isdir():
        out.directory(name, int(member.mtime))
    elif member.issym():
        out.symlink(name, member.linkname)
    else:
        out.hardlink(name, member.linkname)


def _check_owned(rel: str, ti: tarfile.TarInfo) -> None:
    """SnapshotRejected unless the entry is this process's user's (the job's, in the
    capture's child) and not writable by every user (a link's own mode means nothing;
    an empty file is taken empty, without its write bits for others)."""
    me = os.getuid()
    if ti.uid != me:
        raise SnapshotRejected(
            f"{rel} belongs to uid {ti.uid}, not to the job's user (uid {me}): another user "
            "put it there; not captured"
        )
    if ti.isreg() and ti.size == 0 and ti.mode & 0o002:
        # An empty lock file (uv makes every venv's `.lock` 0666): its bytes are none,
        # whatever another user writes after this look (the archive takes ti.size of
        # them), and it is kept without others' write, as a restore gives it back anyway.
        ti.mode &= ~0o022
        return
    if not ti.issym() and ti.mode & 0o002:
        raise SnapshotRejected(
            f"{rel} is writable by every user (mode {ti.mode & 0o7777:04o}): another user "
            "could have changed it; not captured (chmod o-w, and install again)"
        )


def prefix_mode(captured: int) -> int:
    """The mode a restored prefix gets from the captured prefix's: its read and search
    bits for group and others, no write or special bits, rwx for its owner.

    >>> oct(prefix_mode(0o700)), oct(prefix_mode(0o2777)), oct(prefix_mode(0o750))
    ('0o700', '0o755', '0o750')
    """
    return (captured & 0o055) | 0o700


def walk_prefix(prefix: str) -> list[str]:
    """Every entry under ``prefix`` (not following links), parents before children."""
    out: list[str] = []
    for top, dirs, files in os.walk(prefix):
        dirs.sort()
        rel = os.path.relpath(top, prefix)
        base = "" if rel == "." else rel + "/"
        out.extend(base + d for d in dirs)
        out.extend(base + f for f in sorted(files))
    return sorted(out)


def write_snapshot(out_fd: int, prefix: str, names: Sequence[str] | None) -> dict[str, Any]:
    """Write a tar stream of ``names`` (default: everything) under ``prefix`` to ``out_fd``.

    Returns the entry list, what was left out (sockets, FIFOs, devices) and the
    prefix's own mode (the restore gives it back: a prefix kept 0700 stays private).

    Runs as the job's user, and refuses an entry that is not that user's or that every
    user may write: another user could have changed it (or put it there) before the
    capture, and the snapshot would carry their bytes into the user's later jobs.
    """
    entries: list[list[Any]] = []
    skipped: list[str] = []
    st = os.lstat(prefix)
    if not stat.S_ISDIR(st.st_mode):
        raise SnapshotRejected(f"{prefix} is not a directory")
    todo = sorted(names) if names is not None else walk_prefix(prefix)
    # This runs in a child forked from a threaded hook, where NSS (sssd, LDAP) may
    # deadlock; gettarinfo would look up a user and group name per member, which the
    # snapshot drops anyway. Without these modules tarfile leaves the names empty.
    tarfile.pwd = tarfile.grp = None  # type: ignore[attr-defined]
    with (
        os.fdopen(out_fd, "wb", buffering=1 << 20, closefd=False) as out,
        tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tf,
    ):
        for rel in todo:
            check_name(rel)
            path = os.path.join(prefix, rel)
            try:
                ti = tf.gettarinfo(path, arcname=rel)
            except FileNotFoundError:
                skipped.append(rel)
                continue
            if ti is None or not (ti.isreg() or ti.isdir() or ti.issym() or ti.islnk()):
                skipped.append(rel)
                continue
            _check_owned(rel, ti)
            ti.uid = ti.gid = 0
            # A float mtime costs every member a pax header, which the restore must parse
            # too; whole seconds are what tar keeps and what .pyc checks compare.
            ti.mtime = int(ti.mtime)
            if ti.isreg():
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                with os.fdopen(fd, "rb") as f:
                    if os.fstat(fd).st_size != ti.size:
                        raise SnapshotRejected(f"{rel} changed while it was captured")
                    tf.addfile(ti, f)
            else:
                tf.addfile(ti)
            e = entry_of(ti)
            assert e is not None
            entries.append([e.name, e.type, e.size, e.link])
    return {"entries": entries, "skipped": skipped, "mode": stat.S_IMODE(st.st_mode)}
