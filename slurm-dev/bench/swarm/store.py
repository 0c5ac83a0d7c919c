"""The emulator's store: every piece of the job over HTTP/1.1 (keep-alive), from the store host.

``GET /p/<index>`` answers piece *index* (read with ``pread`` from the piece file at the
offset the layout gives), as an object store serving byte ranges. ``GET /ws/<name>/<kind>``
(with or without ``Range: bytes=A-B``) answers the bytes of every piece of one kind, in
layout order, then zeros up to a whole 16 KiB, as one file: what a BitTorrent web seed
(BEP 19) asks for a multi-file torrent named *name* whose files are the kinds (the
``libtorrent`` engine's torrent).
``bench.py`` runs it in the store's network namespace, behind the store's (slower) link;
it prints ``ready``.

    store.py --file PIECES --layout LAYOUT.json --bind IP --port P
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WEB_SEED_ALIGN = 16 << 10  # bench.py's LT_PIECE


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", required=True)
    ap.add_argument("--layout", required=True)
    ap.add_argument("--bind", required=True)
    ap.add_argument("--port", type=int, required=True)
    a = ap.parse_args()
    fd = os.open(a.file, os.O_RDONLY)
    with open(a.layout) as f:
        pieces = json.load(f)
    layout = [(p["offset"], p["size"]) for p in pieces]
    # Each kind's pieces are contiguous in the piece file (make_pieces): one extent a kind.
    kinds: dict[str, tuple[int, int]] = {}
    for p in pieces:
        start, size = kinds.get(p["kind"], (p["offset"], 0))
        kinds[p["kind"]] = (start, size + p["size"])
    # A kind's file as the torrent has it: zeros up to a whole number of torrent pieces
    # (bench.py's make_torrent). libtorrent 2.1.1 fails the hash of a piece that a web
    # seed sent next to a v2 pad file and bans the web seed ("url seed failed: peer
    # banned"), so the torrent has no pad files.
    padded = {k: -(-size // WEB_SEED_ALIGN) * WEB_SEED_ALIGN for k, (_, size) in kinds.items()}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if self.path.startswith("/ws/"):
                self.web_seed(self.path.rsplit("/", 1)[-1])
                return
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

        def web_seed(self, kind: str) -> None:
            """One kind's bytes as a file, a byte range of it if asked (one range)."""
            if kind not in kinds:
                self.send_error(404)
                return
            start, real = kinds[kind]
            size = padded[kind]
            first, last, status = 0, size - 1, 200
            if rng := self.headers.get("Range"):
                try:
                    a, b = rng.removeprefix("bytes=").split("-")
                    first, last, status = int(a), min(int(b or size - 1), size - 1), 206
                except ValueError:
                    self.send_error(400)
                    return
                if first > last:
                    self.send_error(416)
                    return
            data = os.pread(fd, max(0, min(last + 1, real) - first), start + first)
            data += bytes(last - first + 1 - len(data))  # the padding's zeros
            if os.environ.get("SWARM_STORE_LOG"):
                print(f"store: {self.path} {rng} -> {status} {len(data)}", file=sys.stderr)
            self.send_response(status)
            if status == 206:
                self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
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
