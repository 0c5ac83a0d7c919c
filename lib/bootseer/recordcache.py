"""Sealed records kept on the node: read from the store once per node, checked at every use.

Every prolog needs a few sealed records before it moves a byte of a job's data: the
snapshot's ref and manifest, the image's name record, manifest and traces. Read from the
store by every prolog, a 30 MiB snapshot manifest leaves the store once per job per
node; and with the store hung or down, a node that already ran the job could not start
it again. A :class:`RecordCache` keeps the sealed bytes (the MAC with them) in a
root-only directory of the node's cache (``<cache_dir>/records/``) and opens them under
the site keys each time it gives them out, so the copy is worth exactly what the store's
is: a copy altered on disk, sealed for another purpose or place, or sealed under a key
since dropped from the key file is refused, forgotten and read again from the store.

Two kinds of record, two rules:

- :meth:`RecordCache.fixed`: a record that never changes once written (a snapshot's
  manifest names its archive; an image manifest's key is its content's digest): the
  node's copy when it opens, else the store's, kept.
- :meth:`RecordCache.latest`: a record rewritten over time (a ref, a name record, a
  trace): the store's, kept; the node's copy only when the store fails or does not
  answer within ``wait`` seconds (an outage costs no job what its node already had).
  A record the store says is gone is gone here too (and, the store hung, still gone).

A reader without site keys (a user's command) gets no cache: it trusts nothing it could
not have written, and root's directory is not its to read::

    >>> import tempfile
    >>> from pathlib import Path
    >>> from bootseer.sitekey import SiteKeys
    >>> from bootseer.store import open_store
    >>> d = Path(tempfile.mkdtemp()); store = open_store(f"file://{d}/store")
    >>> keys = SiteKeys([b"k" * 32])
    >>> store.write_bytes("m/a.json", keys.seal("deps.manifest", "m/a.json", b'{"x":1}'))
    >>> records = RecordCache(d / "records")
    >>> records.fixed(store, "m/a.json", 1 << 20, "deps.manifest", keys)[:7]
    b'{"x":1,'
    >>> store.delete("m/a.json")  # the node's copy serves the next job
    >>> records.fixed(store, "m/a.json", 1 << 20, "deps.manifest", keys)[:7]
    b'{"x":1,'
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from bootseer.errors import StoreError
from bootseer.sitekey import Purpose, SealError, SiteKeys
from bootseer.store import Store

if TYPE_CHECKING:
    from bootseer.config import SiteConfig

MAX_BYTES = 1 << 30  # kept records in all; the least recently used go first
WAIT = 5.0  # seconds a rewritten record waits on the store before the node's copy serves

# Store reads a `latest` stopped waiting for: they finish (or hit the store's own bound)
# in these threads, never in the caller's.
_readers = cf.ThreadPoolExecutor(max_workers=8, thread_name_prefix="record-read")


def node_records(cfg: SiteConfig, log: Callable[[str], None] = lambda _: None) -> RecordCache:
    """The node's record cache (``<cache_dir>/records``), for a root-run part."""
    from bootseer.nodepaths import NodePaths

    return RecordCache(NodePaths(cfg).records, log=log)


class RecordCache:
    def __init__(
        self,
        root: Path,
        max_bytes: int = MAX_BYTES,
        log: Callable[[str], None] = lambda _: None,
        wait: float = WAIT,
    ) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.wait = wait  # latest's default
        self.log = log
        self._lock = threading.Lock()

    # -- reading ---------------------------------------------------------------------

    def fixed(self, store: Store, key: str, limit: int, purpose: Purpose, keys: SiteKeys) -> bytes:
        """The sealed bytes of the never-rewritten record at ``key``: the node's copy if
        it opens under ``keys``, else the store's (kept when it opens; the caller opens
        what it gets, and refuses it as ever if it does not). ``FileNotFoundError`` and
        store errors as :meth:`Store.read_bytes` raises them."""
        raw = self.held(key, purpose, keys)
        if raw is not None:
            return raw
        raw = store.read_bytes(key, limit=limit)
        self._keep(key, raw, purpose, keys)
        return raw

    def latest(
        self,
        store: Store,
        key: str,
        limit: int,
        purpose: Purpose,
        keys: SiteKeys,
        wait: float | None = None,
    ) -> bytes:
        """The sealed bytes of the rewritten record at ``key``: the store's (kept when it
        opens); the node's copy that opens when the store fails or takes more than
        ``wait`` seconds (default: the cache's); with no copy here, the store's error or
        its late answer."""
        wait = self.wait if wait is None else wait
        fut = _readers.submit(store.read_bytes, key, limit)
        try:
            raw = fut.result(timeout=wait)
        except FileNotFoundError:
            self.forget(key)
            self._absent(key).touch(mode=0o600)
            raise
        except (cf.TimeoutError, StoreError, OSError) as exc:
            why = f"no answer in {wait:g}s" if isinstance(exc, cf.TimeoutError) else exc
            held = self.held(key, purpose, keys)
            if held is not None:
                self.log(f"{key}: the node's copy (the store: {why})")
                return held
            if self._absent(key).exists():
                # The store's last word here was that there is none (a trace not yet
                # saved): no record is no data, so nothing to verify; the job goes on.
                raise FileNotFoundError(f"{key}: none when last read (the store: {why})") from None
            raw = fut.result()  # nothing known here: the store's answer, or its error
        self._keep(key, raw, purpose, keys)
        return raw

    def forget(self, key: str) -> None:
        """Drop the node's copy of ``key`` (one found broken past its seal)."""
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()
        with contextlib.suppress(FileNotFoundError):
            self._absent(key).unlink()

    # -- the directory ---------------------------------------------------------------

    def _path(self, key: str) -> Path:
        return self.root / hashlib.sha256(key.encode()).hexdigest()

    def _absent(self, key: str) -> Path:
        """Where a record the store last said it does not have is remembered so."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        return self._path(key).with_suffix(".absent")

    def held(self, key: str, purpose: Purpose, keys: SiteKeys) -> bytes | None:
        """The node's copy of ``key`` if it opens under ``keys`` (else it is forgotten)."""
        path = self._path(key)
        try:
            raw = path.read_bytes()
        except OSError:
            return None
        try:
            keys.open(purpose, key, raw)
        except SealError as exc:
            self.log(f"{key}: the node's copy refused, read again from the store: {exc}")
            self.forget(key)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # used: the last to go
        return raw

    def _keep(self, key: str, raw: bytes, purpose: Purpose, keys: SiteKeys) -> None:
        if not keys.verifies(purpose, key, raw):
            return  # not worth keeping: the caller refuses it (and counts the refusal once)
        path = self._path(key)
        with contextlib.suppress(OSError):
            if path.stat().st_size == len(raw) and path.read_bytes() == raw:
                return  # held already (a mount reads its manifests again and again)
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(raw)
            os.replace(tmp, path)
            with contextlib.suppress(FileNotFoundError):
                self._absent(key).unlink()
        except OSError as exc:  # a full disk costs the next job a store read, no more
            self.log(f"{key}: not kept on the node: {exc}")
            return
        self._trim()

    def _trim(self) -> None:
        with self._lock:
            try:
                stats = [(e.stat(), e.path) for e in os.scandir(self.root)]
                files = [(st.st_mtime, st.st_size, path) for st, path in stats]
            except OSError:
                return
            total = sum(size for _, size, _ in files)
            for _, size, path in sorted(files):
                if total <= self.max_bytes:
                    break
                with contextlib.suppress(OSError):
                    os.unlink(path)
                    total -= size
