#!/usr/bin/env python3
"""What one GET from the S3 store costs by its size: the client's CPU and the store host's
per GiB (issue 19).

Every image block is its own 256 KiB object in the store, and a cold node's agent asks for
each with ``Store.read_bytes``: pyarrow sends a ``HEAD`` then a ``GET``. This writes one
scratch object to a running slurm-dev cluster's S3 store, then, from inside node n1's
network namespace (a fresh process, as the agent reads), reads it in pieces of each
``--sizes`` KiB with ``Store.read_range`` and opens it ``--opens`` times without reading
(the ``HEAD`` alone), sizes alternating over ``--reps`` rounds. ``--ways`` compares how a
piece's bytes are kept: ``copy`` (``Store.read_range``: the bytes pyarrow gives, copied
into a fresh object), ``view`` (``Store.read_range_view``: those bytes, uncopied) and
``buffer`` (pyarrow's own buffer from its memory pool). It reports per size and way the
reader's CPU seconds per GiB, the store host's (SeaweedFS, its process's
``/proc/PID/stat``), and MB/s. The scratch object is deleted at the end, even on failure.

    slurm-dev/bench/image/getsize.py --state-dir /var/tmp/bootseer-dev \\
        --json slurm-dev/bench/image/results-getsize.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TOP = HERE.parents[2]
sys.path.insert(0, str(TOP / "slurm-dev"))
sys.path.insert(0, str(HERE.parent))

import devcluster  # noqa: E402
from benchkit import load1, log  # noqa: E402

KEY = f"bench/getsize/{os.getpid()}"

READER = """
    import json, os, resource, sys, time
    sys.path.insert(0, sys.argv[1])
    from bootseer.credentials import read_secrets_file
    from bootseer.store import open_store
    uri, secrets, key, piece, size, weed, opens, way = sys.argv[2:10]
    piece, size, weed = int(piece), int(size), int(weed)
    creds = read_secrets_file(secrets)
    store = open_store(uri, creds.access_key, creds.secret_key, create=False, look=False)

    def weed_cpu():
        f = open(f"/proc/{weed}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    def own():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    store.read_range(key, 0, 4096)  # the connection up
    t, c, w, got = time.perf_counter(), own(), weed_cpu(), 0
    def read_buffer(key, off, n):  # pyarrow's own buffer, from its memory pool
        with store.fs.open_input_file(store.path(key)) as f:
            f.seek(off)
            return memoryview(f.read_buffer(n))

    read = {"view": store.read_range_view, "buffer": read_buffer}.get(way, store.read_range)
    if piece:
        for off in range(0, size - piece + 1, piece):
            got += len(read(key, off, piece))
    else:  # opens only: the HEAD each read pays
        for _ in range(int(opens)):
            with store.fs.open_input_file(store.path(key)) as f:
                got += 1
    print(json.dumps({"s": time.perf_counter() - t, "cpu": own() - c,
                      "store_cpu": weed_cpu() - w, "got": got}))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--state-dir",
        type=Path,
        default=Path(os.environ.get("BOOTSEER_DEV_STATE", "/var/tmp/bootseer-dev")),
    )
    p.add_argument("--size-mib", type=int, default=256, help="the scratch object's size")
    p.add_argument("--sizes", default="256,1024,4096,8192", help="GET sizes, KiB")
    p.add_argument("--opens", type=int, default=1000, help="HEADs alone (0: none)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument(
        "--ways",
        default="copy",
        help="copy (Store.read_range: the bytes pyarrow gives, copied), view "
        "(Store.read_range_view: a view of them), buffer (a view of pyarrow's own buffer, "
        "``read_buffer``: no bytes object), comma-separated (alternated)",
    )
    p.add_argument("--json", type=Path, help="write the records here")
    args = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("getsize: run as root (it enters a node's network namespace)")
    cluster = devcluster.Cluster.load(args.state_dir)
    if not cluster.s.s3:
        raise SystemExit("getsize: the cluster has no S3 store host (slurm-dev/up --s3)")
    weed = cluster.alive("weed")
    if not weed:
        raise SystemExit("getsize: SeaweedFS is not running")
    store = cluster.open_store()
    size = args.size_mib << 20
    store.write_bytes(KEY, os.urandom(size), atomic=False)
    rows: list[dict[str, Any]] = []
    try:
        ways = args.ways.split(",")
        sizes = [(int(k) << 10, w) for k in args.sizes.split(",") for w in ways]
        sizes += [(0, "copy")] if args.opens else []
        for rep in range(args.reps):
            for piece, way in sizes:
                out = subprocess.run(
                    [
                        *cluster.s.network.enter(cluster.s.node_names[0]),
                        sys.executable,
                        "-c",
                        textwrap.dedent(READER),
                        str(TOP / "lib"),
                        cluster.store_uri(),
                        str(cluster.secrets_file),
                        KEY,
                        str(piece),
                        str(size),
                        str(weed),
                        str(args.opens),
                        way,
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                r = json.loads(out)
                r.update(piece=piece, way=way, rep=rep, load1=load1())
                rows.append(r)
                log(f"round {rep + 1}: {piece >> 10 or 'HEAD'} KiB ({way}): {r['s']:.2f}s")
    finally:
        store.delete(KEY)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def table(rows: list[dict[str, Any]]) -> str:
    """Medians per GET size: MB/s and CPU seconds per GiB; for HEADs, per request."""
    lines = [f"{'GET':>14}{'MB/s':>8}{'client CPU-s/GiB':>18}{'store CPU-s/GiB':>17}  load1"]
    for piece, way in dict.fromkeys((r["piece"], r.get("way", "copy")) for r in rows):
        rs = [r for r in rows if r["piece"] == piece and r.get("way", "copy") == way]
        s, cpu, store = (statistics.median(r[k] for r in rs) for k in ("s", "cpu", "store_cpu"))
        loads = f"{min(r['load1'] for r in rs)}-{max(r['load1'] for r in rs)}"
        got = rs[0]["got"]
        if piece:
            gib = got / (1 << 30)
            lines.append(
                f"{piece >> 10:>6} KiB {way:>4}{got / s / 1e6:>8.0f}{cpu / gib:>18.2f}"
                f"{store / gib:>17.2f}  {loads}"
            )
        else:
            lines.append(
                f"{'HEAD':>14}{'':>8}{cpu / got * 1e3:>15.3f} ms{store / got * 1e3:>14.3f} ms"
                f"  {loads}  (each)"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
