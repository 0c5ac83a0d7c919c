"""The benchmark container's entry point: reads what a framework reads when it starts
(its libraries, ``app/lib``), never the bulk of the image (``data/``)."""

import os

app = os.path.dirname(os.path.abspath(__file__))
read = 0
for name in sorted(os.listdir(os.path.join(app, "lib"))):
    with open(os.path.join(app, "lib", name), "rb") as f:
        while chunk := f.read(1 << 20):
            read += len(chunk)
print(f"container started: read {read >> 20} MiB", flush=True)
