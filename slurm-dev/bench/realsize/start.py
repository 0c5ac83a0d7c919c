"""The real-size benchmark container's entry point: starts as a training framework does.
It imports what ``BENCH_START_IMPORTS`` names (``a:b``) from the image's Python tree (torch, in the
full size: its shared libraries are mapped and faulted in) and reads whole the libraries
``app/read_whole.txt`` lists (the CUDA-sized ones a GPU job loads); never ``data/``."""

import importlib
import os
import sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(root, "site-packages"))
for name in filter(None, os.environ.get("BENCH_START_IMPORTS", "").split(":")):
    importlib.import_module(name)
read = 0
buf = bytearray(1 << 20)
with open(os.path.join(root, "app", "read_whole.txt")) as listing:
    for rel in listing.read().split():
        with open(os.path.join(root, rel), "rb", buffering=0) as f:
            while n := f.readinto(buf):
                read += n
print(f"container started: read {read >> 20} MiB whole", flush=True)
