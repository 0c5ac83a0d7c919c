"""Stores: where images, traces, snapshots, stripes and phase records live.

A store is a URI handled by :mod:`pyarrow.fs`::

    file:///shared/bootseer                          a shared POSIX filesystem
    s3://bucket/prefix?endpoint_override=h:8333&scheme=http
    hdfs://namenode:8020/bootseer

Keys are relative, ``/``-separated and never contain ``..``. Every write becomes
visible whole or not at all: data goes to a temporary key first and is moved into
place when complete (a rename on POSIX, a copy of a complete object on S3), except an
object S3 receives in one upload, which it shows only once complete anyway.
Temporary keys start with ``.tmp-`` and are never listed.

    >>> store = open_store("file:///tmp/doc-store")
    >>> store.write_bytes("hello/world.txt", b"hi")
    >>> store.read_bytes("hello/world.txt")
    b'hi'
"""

from __future__ import annotations

from bootseer.store._store import (
    PUBLIC_TOP,
    TMP_PREFIX,
    ObjectInfo,
    Store,
    check_key,
    open_store,
)

__all__ = ["PUBLIC_TOP", "TMP_PREFIX", "ObjectInfo", "Store", "check_key", "open_store"]
