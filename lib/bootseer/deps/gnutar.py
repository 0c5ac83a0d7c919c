"""Extraction by GNU tar, fed a stream whose every header was checked first.

A restore's extracting child (the job user's rights) reads the decoded stream and
passes it on to ``tar -x`` (the same user, never root) through a pipe: each header is
read here, checked by :class:`~bootseer.deps.archive.SnapshotFilter` (every rule of
the Python extraction: no absolute or ``..`` name, nothing below a symlink of the
archive, links inside or into ``deps.link_roots``, hard links to files before them,
no device or FIFO, no sparse member, the counts and bytes, the manifest's entry at the
same position) and rewritten before tar sees it: the mode becomes the filtered one
(:func:`~bootseer.deps.datafilter.filtered_mode`; a directory's: the umask's), owner
and group ids and names become 0 and empty. The member's data goes on with
``splice`` (no copy through Python), so this process costs tens of microseconds a
member and tar does the writing.

The pass accepts only what the capture writes (:func:`~bootseer.deps.archive.write_snapshot`:
POSIX ustar headers, pax extended headers with a few keywords), so that it and tar
cannot read the same bytes two ways:

- the magic must be POSIX's (``ustar\\0`` ``00``): an old-GNU header's prefix field
  holds times that tarfile would read as a name prefix;
- types: file, directory, symlink, hard link and pax ``x``; no global ``g`` header, no
  GNU long names (``L``/``K``), no old sparse ``S``, no ``AREGTYPE``;
- numbers in plain octal only (no base-256); a checksum that does not match is
  refused (tar would skip forward and find headers the pass never saw);
- a pax record must be well formed, its keyword one of :data:`PAX_KEYWORDS` and given
  once; ``GNU.sparse.*`` is a sparse member;
- a directory, symlink or hard link carries no data (tar and tarfile would skip
  different lengths);
- after the first zero block only zeros follow.

tar runs with ``--no-same-owner --same-permissions --keep-old-files`` (the rewritten
modes exactly, a name never written twice), no xattrs, ACLs or SELinux labels,
``TAR_OPTIONS`` and the locale cleared. Its own defences stay on: it strips a leading
``/``, refuses ``..`` members and makes a symlink whose target is absolute or holds
``..`` only at the end (a placeholder file until then), so nothing is written through
it. Last, :func:`check_tree` walks what tar wrote: exactly the manifest's entries,
their types, sizes, link targets and filtered modes, hard links sharing their file.

    >>> oct(int(_rewrite(bytes(512), 0o755)[100:107], 8))
    '0o755'
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
import signal
import stat
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Sequence

from bootseer.deps.manifest import Entry
from bootseer.errors import BootseerError

BLOCK = 512
PAX_KEYWORDS = frozenset(
    {"path", "linkpath", "size", "mtime", "atime", "ctime", "uid", "gid", "uname", "gname"}
)
"""What tarfile's pax writer puts in a capture's extended headers (and a few more
times and ids, which tar ignores for an unprivileged extraction)."""
TYPES = (tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE)
SPECIAL = (tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE)
MAGIC = b"ustar\x0000"
_ZERO = bytes(BLOCK)
_SPLICE_MAX = 1 << 20
TAR_ARGS = (
    "-x",
    "--file=-",
    "--read-full-records",
    # 64 KiB records: its default 10 KiB costs 6x the calls; 1 MiB ones, as large as
    # the pipe, make the pass and tar take turns (each waits for the other's whole MiB).
    "--blocking-factor=128",
    "--no-same-owner",
    "--same-permissions",
    "--keep-old-files",
    "--no-xattrs",
    "--no-acls",
    "--no-selinux",
)
TAR_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}
MAX_STDERR = 4000


Filter = Callable[[tarfile.TarInfo], "int | None"]
"""A :class:`~bootseer.deps.archive.SnapshotFilter`: the member's mode, or it raises."""


class HeaderError(BootseerError):
    """A header the pass does not accept (raised as SnapshotRejected by the caller)."""


@functools.cache
def gnu_tar() -> str | None:
    """The path of GNU tar on this node, or None (busybox or bsdtar are not used)."""
    path = shutil.which("tar", path=TAR_ENV["PATH"])
    if path is None:
        return None
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, env=TAR_ENV, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return path if out.startswith(b"tar (GNU tar)") else None


def _octal(field: bytes, what: str) -> int:
    digits = field.rstrip(b"\0 ").lstrip(b" ")
    if not digits:
        return 0
    if not digits.isdigit() or b"8" in digits or b"9" in digits:
        raise HeaderError(f"{what} field {field!r} is not octal")
    return int(digits, 8)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _pax_records(data: bytes) -> dict[str, str]:
    """The records of a pax extended header, exactly as POSIX writes them."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos, pos + 21)
        if space <= pos or not data[pos:space].isdigit():  # bytes: ASCII digits only
            raise HeaderError("malformed pax record (its length)")
        length = int(data[pos:space])
        end = pos + length
        if length < 5 or end > len(data) or data[end - 1 : end] != b"\n":
            raise HeaderError("malformed pax record (its length or end)")
        key, eq, value = data[space + 1 : end - 1].partition(b"=")
        name = key.decode("ascii", "replace")
        if not eq or not key:
            raise HeaderError("malformed pax record (no keyword)")
        if name.startswith("GNU.sparse"):
            raise HeaderError("sparse files are not allowed")
        if name not in PAX_KEYWORDS:
            raise HeaderError(f"pax keyword {name!r} is not one a capture writes")
        if name in out:
            raise HeaderError(f"pax keyword {name!r} twice")
        out[name] = _text(value)
        pos = end
    return out


def _checksum_ok(block: bytes) -> bool:
    want = _octal(block[148:156], "checksum")
    got = sum(block) - sum(block[148:156]) + 8 * 0x20
    return want == got


def _rewrite(block: bytes, mode: int) -> bytes:
    """``block`` with ``mode``, ids 0, no owner or group names, and its checksum."""
    out = bytearray(block)
    out[100:108] = b"%07o\0" % mode
    out[108:116] = b"0000000\0"
    out[116:124] = b"0000000\0"
    out[265:297] = bytes(32)
    out[297:329] = bytes(32)
    out[148:156] = b"        "
    out[148:156] = b"%06o\0 " % sum(out)
    return bytes(out)


class Reader:
    """Exact reads from a pipe, and its data spliced on into another."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.offset = 0

    def exactly(self, n: int) -> bytes:
        got = os.read(self.fd, n)
        if len(got) < n and got:
            parts = [got]
            left = n - len(got)
            while left:
                more = os.read(self.fd, left)
                if not more:
                    break
                parts.append(more)
                left -= len(more)
            got = b"".join(parts)
        self.offset += len(got)
        return got

    def splice_to(self, out: int, n: int) -> None:
        left = n
        while left:
            moved = os.splice(self.fd, out, min(left, _SPLICE_MAX))
            if not moved:
                raise HeaderError(f"the archive ends inside a member ({left} bytes short)")
            left -= moved
        self.offset += n


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _padded(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


def pass_headers(src: Reader, out: int, flt: Filter, umask: int) -> int:
    """Check and rewrite every header from ``src`` into ``out`` (tar's stdin), their
    data spliced after them; end at the first zero block, and check only zeros follow.
    ``flt`` is a :class:`~bootseer.deps.archive.SnapshotFilter`. Returns the bytes
    written to ``out``."""
    sent = 0
    pending = b""  # a pax header's blocks, sent with the header they describe
    pax: dict[str, str] | None = None
    while True:
        block = src.exactly(BLOCK)
        if len(block) < BLOCK:
            raise HeaderError(f"the archive ends at byte {src.offset} without its end blocks")
        if block == _ZERO:
            break
        if not _checksum_ok(block):
            raise HeaderError(f"bad header checksum at byte {src.offset - BLOCK}")
        if block[257:265] != MAGIC:
            raise HeaderError(f"header at byte {src.offset - BLOCK} is not POSIX ustar")
        kind = block[156:157]
        size = _octal(block[124:136], "size")
        if kind == tarfile.XHDTYPE:
            if pax is not None:
                raise HeaderError("two pax headers for one member")
            if size > 1 << 20:
                raise HeaderError(f"pax header of {size} bytes")
            data = src.exactly(_padded(size))
            if len(data) < _padded(size):
                raise HeaderError("the archive ends inside a pax header")
            pax = _pax_records(data[:size])
            pending = block + data
            continue
        name = _text(block[0:100].split(b"\0", 1)[0])
        prefix = block[345:500].split(b"\0", 1)[0]
        if prefix:
            name = _text(prefix) + "/" + name
        link = _text(block[157:257].split(b"\0", 1)[0])
        if pax:
            name = pax.get("path", name)
            link = pax.get("linkpath", link)
            if "size" in pax:
                if not (pax["size"].isascii() and pax["size"].isdigit()):
                    raise HeaderError(f"pax size {pax['size']!r}")
                size = int(pax["size"])
        if kind not in TYPES:
            if kind in SPECIAL:
                raise HeaderError(f"{name!r} is a special file (type {kind!r})")
            what = "sparse files are not allowed" if kind == tarfile.GNUTYPE_SPARSE else ""
            raise HeaderError(what or f"member type {kind!r} is not one a capture writes")
        if kind != tarfile.REGTYPE and size:
            raise HeaderError(f"{name!r}: a {kind!r} member with {size} bytes of data")
        ti = tarfile.TarInfo(name.rstrip("/") if kind == tarfile.DIRTYPE else name)
        ti.type, ti.size, ti.linkname = kind, size, link
        ti.mode = _octal(block[100:108], "mode")
        mode = flt(ti)  # SnapshotRejected, or the mode to give it (None: dir or symlink)
        if mode is None:
            mode = 0o777 & ~umask if kind == tarfile.DIRTYPE else 0o777
        header = pending + _rewrite(block, mode)
        _write_all(out, header)
        sent += len(header)
        if size:
            src.splice_to(out, _padded(size))
            sent += _padded(size)
        pending, pax = b"", None
    if pax is not None:
        raise HeaderError("a pax header without its member")
    # tar stops at the first zero block too; what follows must be zeros (the rest of
    # the end blocks and the record's padding).
    while chunk := os.read(src.fd, 1 << 20):
        if chunk.count(0) != len(chunk):
            raise HeaderError("data after the end of the archive")
    _write_all(out, bytes(2 * BLOCK))  # a short last record is fine: tar reads a pipe
    return sent + 2 * BLOCK


def extract(in_fd: int, dest: str, flt: Filter, tar: str) -> None:
    """Extract the stream on ``in_fd`` into the empty directory ``dest`` with ``tar``
    as this process's user, every header checked by ``flt`` on the way (the caller
    then runs :func:`check_tree`). :class:`HeaderError` (or the filter's own error) on any refusal;
    tar is stopped and reaped before this returns or raises."""
    umask = os.umask(0)
    os.umask(umask)
    with tempfile.TemporaryFile() as err:
        r, w = os.pipe2(os.O_CLOEXEC)
        with contextlib.suppress(OSError):
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
        try:
            proc = subprocess.Popen(
                [tar, *TAR_ARGS, "--directory", dest],
                stdin=r,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=TAR_ENV,
                close_fds=True,
                restore_signals=True,
            )
        except BaseException:
            os.close(w)
            raise
        finally:
            os.close(r)
        done = False
        # tar may end early (its message says why): a write to it is then EPIPE, not a
        # SIGPIPE that kills this child before it cleans up.
        pipe = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        try:
            with contextlib.suppress(BrokenPipeError):  # tar ended early: its status says why
                pass_headers(Reader(in_fd), w, flt, umask)
            os.close(w)
            w = -1
            status = proc.wait()
            done = True
        finally:
            if w >= 0:
                os.close(w)
            if not done:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGKILL)
                proc.wait()
            signal.signal(signal.SIGPIPE, pipe)
        if status != 0:
            err.seek(0)
            said = err.read(MAX_STDERR).decode("utf-8", "replace").strip()
            raise HeaderError(f"tar exited with status {status}: {said}")


def _cuts(name: str) -> list[int]:
    out = []
    cut = name.find("/")
    while cut > 0:
        out.append(cut)
        cut = name.find("/", cut + 1)
    return out


def check_tree(dest: str, entries: Sequence[Entry]) -> None:
    """:class:`HeaderError` unless ``dest`` holds exactly ``entries`` (and the
    directories above them): their types, sizes and link targets, files with no
    setuid, setgid, sticky or group/other write, hard links sharing their file."""
    want = {e.name: e for e in entries}
    above = {n[:cut] for n in want for cut in _cuts(n)}
    seen = 0
    inodes: dict[str, int] = {}
    stack = [("", dest)]
    while stack:
        rel, path = stack.pop()
        with os.scandir(path) as it:
            for d in it:
                name = rel + d.name
                e = want.get(name)
                st = d.stat(follow_symlinks=False)
                kind = stat.S_IFMT(st.st_mode)
                if e is None:
                    if kind == stat.S_IFDIR and name in above:
                        stack.append((name + "/", d.path))  # a directory tar made on the way
                        continue
                    raise HeaderError(f"tar wrote {name!r}, which the manifest does not hold")
                seen += 1
                if e.type == "d":
                    if kind != stat.S_IFDIR:
                        raise HeaderError(f"{name!r}: not a directory after tar")
                    stack.append((name + "/", d.path))
                elif e.type == "l":
                    if kind != stat.S_IFLNK or os.readlink(d.path) != e.link:
                        raise HeaderError(f"{name!r}: not the manifest's symlink after tar")
                else:
                    if kind != stat.S_IFREG or st.st_mode & 0o7022:
                        raise HeaderError(f"{name!r}: not a file of a filtered mode after tar")
                    if e.type == "f":
                        if st.st_size != e.size:
                            raise HeaderError(f"{name!r}: {st.st_size} bytes after tar")
                        inodes[name] = st.st_ino
                    else:
                        inodes.setdefault("\0" + name, st.st_ino)
    if seen != len(want):
        raise HeaderError(f"tar wrote {seen} of the manifest's {len(want)} entries")
    for e in entries:
        if e.type == "h" and inodes.get("\0" + e.name) != inodes.get(e.link):
            raise HeaderError(f"{e.name!r}: not a hard link of {e.link!r} after tar")
