"""The store's S3 reads against the real S3 store host (SeaweedFS), through a proxy that
counts the HTTP requests the client sends."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator

import pytest

from bootseer.credentials import read_secrets_file
from bootseer.store import Store, open_store
from tests.conftest import devcluster

pytestmark = pytest.mark.s3


class CountingProxy:
    """A TCP proxy on loopback to the store host's S3 port that counts the HTTP requests
    passing through (request lines end in `` HTTP/1.1\\r\\n``; reads send no bodies)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.requests = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._socks: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self._socks += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        tail = b""
        try:
            while data := src.recv(1 << 16):
                if count:
                    seen = tail + data
                    with self._lock:
                        self.requests += seen.count(b" HTTP/1.1\r\n")
                    tail = data[-10:]
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        for s in self._socks:
            s.close()


@pytest.fixture
def proxied(s3_store: devcluster.Cluster) -> Iterator[tuple[Store, CountingProxy]]:
    uri = s3_store.store_uri()
    endpoint = uri.split("endpoint_override=", 1)[1].split("&", 1)[0]
    host, port = endpoint.rsplit(":", 1)
    proxy = CountingProxy((host, int(port)))
    creds = read_secrets_file(s3_store.secrets_file)
    try:
        yield (
            open_store(
                uri.replace(endpoint, f"127.0.0.1:{proxy.port}"), creds.access_key, creds.secret_key
            ),
            proxy,
        )
    finally:
        proxy.close()


def test_an_object_is_read_in_one_get(proxied: tuple[Store, CountingProxy]) -> None:
    # pyarrow's S3 stream read to its end in many small ranged GETs: 8x the time and CPU
    # of one GET for a 4 MiB checkpoint unit or image block.
    store, proxy = proxied
    data = os.urandom(4 << 20)
    key = f"bench/one-get-{os.getpid()}"
    store.write_bytes(key, data, atomic=False)
    try:
        before = proxy.requests
        assert store.read_bytes(key) == data
        assert proxy.requests - before <= 2  # the object's size (HEAD), then one GET
        before = proxy.requests
        assert store.read_bytes(key, limit=1000) == data[:1000]
        assert proxy.requests - before <= 2
        before = proxy.requests
        assert store.read_direct(key) == data
        assert proxy.requests - before <= 2
    finally:
        store.delete(key)


def test_a_small_object_is_written_in_one_upload(proxied: tuple[Store, CountingProxy]) -> None:
    # S3 shows an object whole or not at all: a temporary name, its copy and its delete
    # (7x the time per 256 KiB image block) add nothing to an object sent in one upload
    # (pyarrow's: start, one part, complete).
    store, proxy = proxied
    data = os.urandom(256 << 10)
    key = f"bench/one-put-{os.getpid()}"
    try:
        before = proxy.requests
        store.write_bytes(key, data)
        assert proxy.requests - before <= 3
        assert store.read_bytes(key) == data
        assert not [o for o in store.list("bench") if ".tmp-" in o.key]
    finally:
        store.delete(key)
