"""A counting, hangable TCP proxy in front of the S3 store host (real SeaweedFS): how
many requests a client sent, and what it does when the store stops answering."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

from bootseer.credentials import read_secrets_file
from bootseer.store import Store, open_store


class CountingProxy:
    """A TCP proxy on loopback to the store host's S3 port that counts the HTTP requests
    passing through (request lines end in `` HTTP/1.1\\r\\n``; reads send no bodies).
    :meth:`hang` makes it a hung store: connections are taken, nothing is answered."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.requests = 0
        self._flowing = threading.Event()
        self._flowing.set()
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
                self._flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def hang(self) -> None:
        """From now on nothing passes either way (bytes are held, not dropped)."""
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._flowing.set()
        for s in self._socks:
            s.close()


@contextlib.contextmanager
def proxied_store(uri: str, secrets_file: Path) -> Iterator[tuple[Store, CountingProxy]]:
    """The S3 store at ``uri`` opened through a :class:`CountingProxy` of its own."""
    endpoint = uri.split("endpoint_override=", 1)[1].split("&", 1)[0]
    host, port = endpoint.rsplit(":", 1)
    proxy = CountingProxy((host, int(port)))
    creds = read_secrets_file(secrets_file)
    try:
        through = uri.replace(endpoint, f"127.0.0.1:{proxy.port}")
        yield open_store(through, creds.access_key, creds.secret_key), proxy
    finally:
        proxy.close()
