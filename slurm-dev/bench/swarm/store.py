"""The emulator's store: every piece of the job over HTTP/1.1 (keep-alive), from the store host.

``GET /p/<index>`` answers piece *index* (read with ``pread`` from the piece file at the
offset the layout gives), as an object store serving byte ranges. ``bench.py`` runs it in
the store's network namespace, behind the store's (slower) link; it prints ``ready``.

    store.py --file PIECES --layout LAYOUT.json --bind IP --port P
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", required=True)
    ap.add_argument("--layout", required=True)
    ap.add_argument("--bind", required=True)
    ap.add_argument("--port", type=int, required=True)
    a = ap.parse_args()
    fd = os.open(a.file, os.O_RDONLY)
    with open(a.layout) as f:
        layout = [(p["offset"], p["size"]) for p in json.load(f)]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            try:
                offset, size = layout[int(self.path.removeprefix("/p/"))]
            except (ValueError, IndexError):
                self.send_error(404)
                return
            data = os.pread(fd, size, offset)
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer.request_queue_size = 1024
    server = ThreadingHTTPServer((a.bind, a.port), Handler)
    print("ready", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    sys.exit(0)


if __name__ == "__main__":
    main()
