"""The demo container's entry point: reads what a framework reads when it starts
(its libraries), not the bulk of the image (datasets, unused tools)."""

import os
import sys

app = os.path.dirname(os.path.abspath(__file__))
read = 0
for name in sorted(os.listdir(os.path.join(app, "lib"))):
    with open(os.path.join(app, "lib", name), "rb") as f:
        while chunk := f.read(1 << 20):
            read += len(chunk)
image = os.path.getsize(sys.argv[1]) if len(sys.argv) > 1 else 0
print(f"container started: read {read >> 20} MiB of a {image >> 20} MiB image")
