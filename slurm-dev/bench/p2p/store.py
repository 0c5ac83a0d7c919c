"""The spike's store: serves the hot set's pieces over HTTP/1.1 (keep-alive) from the store host.

``GET /p/<index>`` answers one piece (read with ``pread`` from the hot set file), as a
store that keeps a content-addressed block per piece would. Run in the store's network
namespace by ``spike.py``; prints ``ready`` once it listens.

    store.py --file HOTSET --piece-bytes N --bind IP --port P
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", required=True)
    ap.add_argument("--piece-bytes", type=int, required=True)
    ap.add_argument("--bind", required=True)
    ap.add_argument("--port", type=int, required=True)
    a = ap.parse_args()
    fd = os.open(a.file, os.O_RDONLY)
    size = os.fstat(fd).st_size
    npieces = -(-size // a.piece_bytes)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            try:
                index = int(self.path.removeprefix("/p/"))
            except ValueError:
                index = -1
            if not 0 <= index < npieces:
                self.send_error(404)
                return
            data = os.pread(fd, a.piece_bytes, index * a.piece_bytes)
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer.request_queue_size = 256
    server = ThreadingHTTPServer((a.bind, a.port), Handler)
    print("ready", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    sys.exit(0)


if __name__ == "__main__":
    main()
