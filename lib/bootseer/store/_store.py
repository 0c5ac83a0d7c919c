from __future__ import annotations

import builtins
import contextlib
import os
import posixpath
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import parse_qs, urlsplit

from bootseer.directio import DIRECT_ALIGN, Buffers, read_direct, read_file, write_all
from bootseer.errors import StoreError, describe

if TYPE_CHECKING:
    import pyarrow.fs as pafs

_KEY_PART = re.compile(r"^[A-Za-z0-9._@+=:-]+$")
TMP_PREFIX = ".tmp-"
# On a file:// store, what is written under these top-level names stays readable by every
# user (``bootseer report`` reads phase records as the user who runs it); everything else
# (snapshots, image blocks and records, traces, checkpoint units and manifests) is created
# 0600 in 0700 directories, the writer's alone (docs/security.md, "Confidentiality").
PUBLIC_TOP = frozenset({"phases"})
PUBLIC_MODES = (0o644, 0o755)
PRIVATE_MODES = (0o600, 0o700)
# Up to this size (its smallest part) pyarrow's S3 stream holds an object in memory and
# uploads it at close, as one part; S3 shows an object only once its upload completes,
# whole or not at all: atomic without a temporary name, its copy and its delete (a
# 256 KiB image block: 3 requests instead of 8, 4.4 against 30 ms). Larger objects go up
# part by part as they are written, so a failure part-way could complete a short one:
# those take the temporary name (``writer``).
S3_WHOLE_PUT = 5 << 20
# The page-aligned buffers :meth:`Store.read_range` reads ``file://`` pieces into, used
# again (a fresh one's pages cost more to fault in than the read): two, as few agent
# threads read the store at once.
_RANGE_BUFFERS = Buffers(2)
_DENIED = ("permission denied", "accessdenied", "access_denied", "access denied", "forbidden")


def check_key(key: str) -> str:
    """Return ``key`` if it is a safe relative key, else raise :class:`StoreError`."""
    parts = key.split("/")
    if (
        not key
        or key.startswith("/")
        or any(p in ("", ".", "..") or not _KEY_PART.fullmatch(p) for p in parts)
    ):
        raise StoreError(f"invalid store key {key!r}: want relative names of [A-Za-z0-9._@+=:-]")
    return key


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    mtime: float  # seconds since the epoch; 0 where the store does not say
    is_dir: bool = False  # a directory (a prefix with objects under it, on S3)


class Store:
    """One store, rooted at the path part of its URI."""

    def __init__(
        self,
        uri: str,
        fs: pafs.FileSystem,
        root: str,
        anonymous: bool = False,
        public_tops: frozenset[str] = PUBLIC_TOP,
    ) -> None:
        self.uri = uri
        self.fs = fs
        self.root = root.rstrip("/")
        self.anonymous = anonymous  # S3 without credentials (a user's process)
        # Tops written readable by every user on a file:// store: PUBLIC_TOP, or none
        # where the site keeps phase records private ([store] public_phases = false).
        self.public_tops = public_tops

    def __repr__(self) -> str:
        return f"Store({self.uri!r})"

    @property
    def is_local(self) -> bool:
        return self.uri.startswith("file:")

    def path(self, key: str) -> str:
        return f"{self.root}/{check_key(key)}"

    def is_dir(self, key: str) -> bool:
        """True if ``key`` is a directory (a prefix with objects under it, on S3)."""
        import pyarrow.fs as pafs

        fi = self._call(key, self.fs.get_file_info, self.path(key))
        return bool(fi.type == pafs.FileType.Directory)

    def make_dir(self, key: str) -> None:
        """Make ``key`` a directory (and its parents); an empty one lists on POSIX and S3."""
        if self.is_local:
            self._call(key, self._make_dirs, key, True)
            return
        self._call(key, self.fs.create_dir, self.path(key), recursive=True)

    def modes(self, key: str) -> tuple[int, int]:
        """(file mode, directory mode) for ``key`` on a file:// store."""
        return PUBLIC_MODES if key.split("/", 1)[0] in self.public_tops else PRIVATE_MODES

    def _make_dirs(self, key: str, itself: bool = False) -> str:
        """Create the directories above ``key`` (and ``key`` itself with ``itself``) that
        do not exist, with ``key``'s directory mode; the path of the last one. The root
        itself is never made: one gone since the store was opened is an unmounted shared
        filesystem (:class:`StoreError`), not a store to begin on the node's own disk."""
        parts = check_key(key).split("/")
        if not os.path.isdir(self.root):
            raise StoreError(missing_root(self.uri, self.root))
        if not itself:
            parts = parts[:-1]
        dmode = self.modes(key)[1]
        path = self.root
        for part in parts:
            path = f"{path}/{part}"
            try:
                os.mkdir(path, dmode)
            except FileExistsError:
                continue
            os.chmod(path, dmode)  # the umask may have taken bits a public one needs
        return path

    def _create_local(self, key: str, path: str) -> None:
        """Create the file ``path`` (for ``key``) empty, with ``key``'s file mode, before
        pyarrow opens it for writing (it keeps the mode), so it is never readable by
        others, not even while it is written."""
        fmode = self.modes(key)[0]
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, fmode)
        try:
            os.fchmod(fd, fmode)
        finally:
            os.close(fd)

    def _write_local(
        self, key: str, path: str, data: bytes | bytearray | memoryview, direct: bool = False
    ) -> None:
        """``data`` into the file ``path`` (for ``key``), created or emptied with ``key``'s
        mode: one copy, from ``data`` into the page cache (``os.pwrite`` releases the GIL),
        where pyarrow's stream cost a Python round and a buffer more; with ``direct``, its
        whole blocks past the page cache (:func:`bootseer.directio.write_all`)."""
        fmode = self.modes(key)[0]
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, fmode)
        try:
            os.fchmod(fd, fmode)
            write_all(fd, data, direct)
        finally:
            os.close(fd)

    def read_direct(self, key: str, buffers: Buffers | None = None) -> bytes | memoryview:
        """The whole object, as :meth:`read_bytes`; on a ``file://`` store read past the page
        cache (``O_DIRECT``, where the filesystem has it) into a buffer of its own: for big
        objects read once (checkpoint units), no page-cache fill and no copy out of it."""
        if not self.is_local:
            return self.read_bytes(key)
        try:
            data: bytes | memoryview = self._call(key, read_direct, self.path(key), buffers)
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.uri}: {key}: not found") from None
        return data

    def remove_dir(self, key: str) -> None:
        """Remove the directory ``key`` and whatever is under it (callers check it is empty)."""
        self._call(key, self.fs.delete_dir, self.path(key))

    def exists(self, key: str) -> bool:
        import pyarrow.fs as pafs

        return bool(
            self._call(key, self.fs.get_file_info, self.path(key)).type != pafs.FileType.NotFound
        )

    def info(self, key: str) -> ObjectInfo | None:
        import pyarrow.fs as pafs

        fi = self._call(key, self.fs.get_file_info, self.path(key))
        if fi.type == pafs.FileType.NotFound:
            return None
        mtime = fi.mtime.timestamp() if fi.mtime else 0.0
        return ObjectInfo(key, fi.size or 0, mtime, fi.type == pafs.FileType.Directory)

    def read_bytes(self, key: str, limit: int | None = None) -> bytes:
        """The object's bytes; with ``limit``, at most that many (the rest is never read)."""
        if self.is_local:
            try:
                data: bytes = self._call(key, read_file, self.path(key), limit)
                return data
            except FileNotFoundError:
                raise FileNotFoundError(f"{self.uri}: {key}: not found") from None
        whole: bytes = self._call(key, _read_remote, self.fs, self.path(key), limit)
        return whole

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        """``length`` bytes of ``key`` at ``offset`` (fewer where it ends before). On a
        ``file://`` store past the page cache (``O_DIRECT``, where the filesystem has it):
        the node agent reads a piece here once and keeps it in its own cache, and a
        checkpoint unit's bytes are the mount's pages next; the target file's pages
        would be a second copy of them on the node."""
        if not self.is_local:
            return bytes(self.read_range_view(key, offset, length))
        if length <= 0:
            return b""
        lo = offset - offset % DIRECT_ALIGN  # O_DIRECT reads whole blocks from a block
        try:
            view = self._call(
                key, read_direct, self.path(key), _RANGE_BUFFERS, lo, offset + length - lo
            )
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.uri}: {key}: not found") from None
        try:
            return bytes(view[offset - lo :])
        finally:
            _RANGE_BUFFERS.retire(view)
            if isinstance(view, memoryview):
                view.release()

    def read_range_view(self, key: str, offset: int, length: int) -> bytes | memoryview:
        """As :meth:`read_range`, without copying an S3 object's bytes out of the buffer
        pyarrow read them into (its memory pool reuses it once no view is left): for
        reads of several MiB that are cut into blocks (image bundles), where the copy
        into fresh pages, the kernel zeroing each, cost more than the copy itself."""
        if self.is_local:
            return self.read_range(key, offset, length)
        with self._call(key, self.fs.open_input_file, self.path(key)) as f:
            return memoryview(f.read_at(length, offset))

    def open_read(self, key: str) -> Any:
        """A seekable pyarrow file (``read``, ``read_at``, ``seek``, ``size``)."""
        return self._call(key, self.fs.open_input_file, self.path(key))

    def write_bytes(
        self,
        key: str,
        data: bytes | bytearray | memoryview,
        atomic: bool = True,
        direct: bool = False,
    ) -> None:
        """Write ``key``; ``atomic=False`` writes in place (one request less on S3), for
        objects nothing reads until a later atomic write (a manifest) names them.
        ``direct`` (with ``atomic=False``, on a ``file://`` store): past the page cache
        (``O_DIRECT``, where the filesystem has it), for big objects this node will not
        read again soon (checkpoint units): the kernel's copy into fresh page-cache pages
        cost the checkpoint daemon 1.0-1.4 CPU-s per GiB here, more than the hashing."""
        path = self.path(key)
        if atomic and not (self.fs.type_name == "s3" and len(data) <= S3_WHOLE_PUT):
            with self.writer(key) as out:
                out.write(data)
            return
        if self.is_local:
            self._call(key, self._make_dirs, key)
            self._call(key, self._write_local, key, path, data, direct)
            return
        with self._call(key, self.fs.open_output_stream, path, compression=None) as out:
            out.write(data)

    def copy(self, src: str, dst: str) -> None:
        """Copy object ``src`` to ``dst`` inside this store, its bytes never passing through
        this process (S3: CopyObject; a local copy on ``file://``); ``dst`` is written in
        place, as by ``write_bytes(atomic=False)``, with its own key's mode."""
        check_key(src)
        path = self.path(dst)
        if self.is_local:
            self._call(dst, self._make_dirs, dst)
            self._call(dst, self._create_local, dst, path)
        self._call(dst, self.fs.copy_file, self.path(src), path)
        if self.is_local:
            os.chmod(path, self.modes(dst)[0])

    @contextlib.contextmanager
    def writer(self, key: str) -> Iterator[BinaryIO]:
        """Write ``key`` atomically: nothing is visible under it unless the block completes."""
        final = self.path(key)
        parent, name = posixpath.split(final)
        tmp = f"{parent}/{TMP_PREFIX}{uuid.uuid4().hex[:12]}-{name}"
        if self.is_local:
            self._call(key, self._make_dirs, key)
            self._call(key, self._create_local, key, tmp)
        else:
            self._call(key, self.fs.create_dir, parent, recursive=True)
        out = self._call(key, self.fs.open_output_stream, tmp, compression=None)
        try:
            yield out
            out.close()
            self._call(key, self.fs.move, tmp, final)
        except BaseException:
            with contextlib.suppress(Exception):
                out.close()
            with contextlib.suppress(Exception):
                self.fs.delete_file(tmp)
            raise

    def create_exclusive(self, key: str, data: bytes) -> bool:
        """Create ``key`` holding ``data`` only if it does not exist; True if this call did.

        ``data`` must be unique to the caller (a lock puts a random token in it), and is
        what the object holds on every store. Atomic on a POSIX store (``O_EXCL``), so
        exactly one of many callers wins. pyarrow offers no conditional put for S3, so
        there it is a write and a read-back: the last writer wins and every other caller
        reads bytes not its own (a short race remains; docs/image.md).
        """
        if self.is_local:
            final = self.path(key)
            self._call(key, self._make_dirs, key)
            try:
                fd = os.open(final, os.O_WRONLY | os.O_CREAT | os.O_EXCL, self.modes(key)[0])
            except FileExistsError:
                return False
            except OSError as exc:
                raise StoreError(f"store {self.uri}: {key}: {describe(exc)}") from exc
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return True
        if self.exists(key):
            return False
        self.write_bytes(key, data)
        try:
            return self.read_bytes(key) == data
        except FileNotFoundError:
            return False

    def list(self, prefix: str = "", recursive: bool = False) -> list[ObjectInfo]:
        """Objects (files) under ``prefix``; empty if it does not exist."""
        import pyarrow.fs as pafs

        base = self.path(prefix) if prefix else self.root
        sel = pafs.FileSelector(base, allow_not_found=True, recursive=recursive)
        out = []
        for fi in self._call(prefix, self.fs.get_file_info, sel):
            if fi.type != pafs.FileType.File or fi.base_name.startswith(TMP_PREFIX):
                continue
            key = fi.path[len(self.root) + 1 :]
            out.append(ObjectInfo(key, fi.size or 0, fi.mtime.timestamp() if fi.mtime else 0.0))
        return sorted(out, key=lambda o: o.key)

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        """Names of the immediate sub-directories (prefixes) of ``prefix``."""
        import pyarrow.fs as pafs

        base = self.path(prefix) if prefix else self.root
        sel = pafs.FileSelector(base, allow_not_found=True)
        infos = self._call(prefix, self.fs.get_file_info, sel)
        return sorted(fi.base_name for fi in infos if fi.type == pafs.FileType.Directory)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._call(key, self.fs.delete_file, self.path(key))

    def delete_prefix(self, prefix: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._call(prefix, self.fs.delete_dir, self.path(prefix))

    def _call(self, key: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FileNotFoundError:
            raise
        except OSError as exc:
            if "not found" in str(exc).lower() or "NoSuchKey" in str(exc):
                raise FileNotFoundError(f"{self.uri}: {key}: not found") from None
            if isinstance(exc, PermissionError) or any(d in str(exc).lower() for d in _DENIED):
                hint = self._denied_hint(key)
                raise StoreError(f"store {self.uri}: {key}: {describe(exc)}{hint}") from exc
            raise StoreError(f"store {self.uri}: {key}: {describe(exc)}") from exc

    def _denied_hint(self, key: str = "") -> str:
        if os.geteuid() == 0 and not self.anonymous:
            return ""
        top = key.split("/", 1)[0]
        if top in PUBLIC_TOP and top not in self.public_tops:
            return (
                f" (access denied to uid {os.geteuid()}: this site keeps phase records "
                "private, [store] public_phases = false: run `bootseer report` as root)"
            )
        return (
            f" (access denied to uid {os.geteuid()}: users hold no store credentials; only "
            "root-run parts write the store or read users' snapshots and checkpoints, "
            "docs/security.md)"
        )


def _read_remote(fs: pafs.FileSystem, path: str, limit: int | None) -> bytes:
    """One GET of the whole object (or its first ``limit`` bytes). Not a stream's
    ``read()``: pyarrow's S3 stream reads to the end in many small ranged GETs (a 4 MiB
    object: 78 ms against 9 ms in one, 8x the CPU per byte; docs/performance.md)."""
    with fs.open_input_file(path) as f:
        size = f.size()
        return bytes(f.read_at(size if limit is None else min(size, limit), 0))


def missing_root(uri: str, root: str) -> str:
    """What a missing file:// root is, and its fix."""
    return (
        f"store {uri}: {root} does not exist: is its shared filesystem mounted here? "
        f"bootseer never makes a store's root (it would be this node's own disk): mount it, "
        f"or make it once where it is shared (mkdir -p {root})"
    )


def open_store(
    uri: str,
    access_key: str = "",
    secret_key: str = "",
    create: bool = True,
    public_tops: frozenset[str] = PUBLIC_TOP,
    *,
    make_root: bool = True,
    look: bool = True,
) -> Store:
    """Open the store at ``uri``; S3 URIs take ``endpoint_override``, ``scheme``, ``region``.

    ``create=False, look=False`` opens an S3 store without a request (a bucket that is
    not there fails the first read): a prolog that may find what it reads on its node
    when the store hangs must not wait on the store to open it.

    ``create=False`` only looks: a file store's directory (an unmounted shared
    filesystem) or an S3 store's bucket that is not there is a :class:`StoreError`.
    ``make_root=False``: a file store's missing directory is that error too, whatever
    ``create`` says; the site's store is opened so (``StoreSection.open``): every
    bootseer part on a node where ``/shared`` is not mounted would otherwise begin a
    store of the node's own on its root disk, and doctor would pass."""
    import pyarrow.fs as pafs

    parts = urlsplit(uri)
    try:
        if parts.scheme == "s3":
            # The AWS SDK's default "aws-chunked" uploads with trailing checksums are stored
            # verbatim by S3 servers that do not speak them (SeaweedFS, MinIO before 2025):
            # ask for checksums only where the operation requires them.
            os.environ.setdefault("AWS_REQUEST_CHECKSUM_CALCULATION", "WHEN_REQUIRED")
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            fs: pafs.FileSystem = pafs.S3FileSystem(
                access_key=access_key or None,
                secret_key=secret_key or None,
                anonymous=not access_key,
                endpoint_override=query.get("endpoint_override"),
                scheme=query.get("scheme", "https"),
                region=query.get("region", "us-east-1"),
                allow_bucket_creation=True,
                connect_timeout=5,
                request_timeout=30,
            )
            root = f"{parts.netloc}{parts.path}"
            if not create:
                if look:
                    _must_exist(fs, parts.netloc, uri)
            else:
                try:
                    fs.create_dir(root, recursive=True)
                except OSError:
                    # Anonymous access may be read-only: the bucket exists, or the first
                    # read says what is wrong.
                    if access_key:
                        raise
        elif parts.scheme in ("file", ""):
            fs, root = pafs.LocalFileSystem(), parts.path
            if create and make_root:
                fs.create_dir(root, recursive=True)
            elif fs.get_file_info(root).type != pafs.FileType.Directory:
                raise StoreError(missing_root(uri, root))
        else:
            fs, root = pafs.FileSystem.from_uri(uri)
    except (OSError, ValueError) as exc:
        raise StoreError(f"cannot open store {uri}: {describe(exc)}") from exc
    if not root or root == "/":
        raise StoreError(f"store URI {uri} names no directory or bucket")
    anonymous = parts.scheme == "s3" and not access_key
    return Store(uri, fs, root, anonymous=anonymous, public_tops=public_tops)


def _must_exist(fs: pafs.FileSystem, path: str, uri: str) -> None:
    import pyarrow.fs as pafs

    if fs.get_file_info(path).type != pafs.FileType.Directory:
        raise StoreError(f"store {uri}: {path} does not exist (or is not a directory)")
