#!/usr/bin/env python3
"""The peer data path's own cost: CPU-seconds per GiB on the sending and the receiving side.

Two processes on loopback, bootseer's real code on both sides:

- the **sender** (``--role sender``, a child): a :class:`~bootseer.image.cache.BlockCache`
  holding the pieces, and a :class:`~bootseer.p2p.server.PeerServer` serving them to one
  job as the agent does (the piece must be one of the job's; it is read from the cache);
- the **receiver** (this process): the agent's image path, a
  :class:`~bootseer.image.fetch.Fetcher` whose source is a
  :class:`~bootseer.p2p.imagesource.PeerSource` over a :class:`~bootseer.p2p.swarm.Swarm`
  and a :class:`~bootseer.p2p.client.PeerClient`: every piece is asked of its owner (the
  sender), verified, and written into the receiver's own block cache.

Every piece is owned by the sender (pieces are made until enough of them are), so every
byte crosses the socket. Each side's CPU is ``getrusage(RUSAGE_SELF)`` (all threads,
user + system) over the transfer only; the set-up (making and caching the pieces) is
outside it. Loopback has no NIC: the figures are the code's cost, the bound a node's
fabric would not lift.

    datapath.py --gib 1 --runs 3 --json out.json
    datapath.py --smoke --json out.json     # 32 MiB, seconds (the test suite runs it)
    datapath.py --gib 1 --runs 3 --run-kib 0,8192 --json out.json   # before/after, alternated

``--run-kib`` asks the pieces as the agent's prefetch does
(:func:`bootseer.image.prefetch.prefetch_hot`, the whole set as its hot set; before the
receive path without copies the bench asked with ``request_blocks`` and waited on each
block's future in turn, holding every one not yet looked at): in runs of up to that many KiB, one
request each, served by the agent's own ``held_run``/``provide_run`` (0: one request per
piece, as before runs). Several values (``0,8192``) are run in turn, ``--runs`` rounds of
each alternated, so before and after see the same minutes' load.

``--fill`` asks them as the agent's background fill does instead
(:class:`bootseer.image.prefetch.BackgroundFill`: ``BACKGROUND`` priority, the fetcher's
``background_parallel`` threads at CPU priority 19, image order); ``--run-kib 0`` is the
fill before runs, block by block::

    datapath.py --fill --gib 1 --runs 3 --run-kib 0,8192 --json out.json

Records (one per run): ``bytes``, ``pieces``, ``piece_bytes``, ``run_kib``, ``fill``,
``requests`` (the sender's count), ``seconds``, ``mb_s``, ``sender_cpu_s_per_gib``,
``receiver_cpu_s_per_gib``, ``load1``, ``workers``; the JSON holds the runs and their
medians (per ``run_kib`` under ``medians``). Everything it starts is stopped by pid, its files
removed (``--keep`` keeps the sender's cache for the next run).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bootseer import digest
from bootseer.image.cache import BlockCache
from bootseer.image.fetch import Fetcher
from bootseer.image.manifest import Manifest
from bootseer.image.prefetch import BackgroundFill, prefetch_hot
from bootseer.p2p.auth import job_token
from bootseer.p2p.client import PeerClient
from bootseer.p2p.imagesource import PeerSource, held_run, provide_run
from bootseer.p2p.owner import owner
from bootseer.p2p.server import PeerServer, ServedJob

try:
    from bootseer.p2p.server import HeldPiece
except ImportError:  # the code before sendfile, for the "before" figures
    HeldPiece = None  # type: ignore[assignment,misc]
from bootseer.p2p.swarm import Swarm
from bootseer.p2p.wire import PeerError, PieceRequest

JOB = 42
NODES = ("sender", "receiver")
SITE_KEY = b"k" * 32
GIB = 1 << 30


def cpu() -> tuple[float, float]:
    """(user, system) CPU-seconds of this process, all its threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def since(c0: tuple[float, float]) -> tuple[float, float]:
    c1 = cpu()
    return c1[0] - c0[0], c1[1] - c0[1]


def make_pieces(cache: BlockCache, total: int, piece: int) -> list[str]:
    """Pieces the sender owns, ``total`` bytes of them, in ``cache`` (kept from an
    earlier run when they are there)."""
    index = cache.root / f"pieces-{total}-{piece}.txt"
    if index.exists():
        digests = index.read_text().split()
        if all(d in cache for d in digests):
            return digests
    base = bytearray(os.urandom(piece))
    digests = []
    n = 0
    while len(digests) * piece < total:
        base[:8] = n.to_bytes(8, "big")
        n += 1
        d = digest.of(base)  # as the agent names what it is given: BLAKE3
        if owner(d, NODES) == "sender":
            cache.put(d, bytes(base))
            digests.append(d)
    index.write_text("\n".join(digests))
    return digests


def sender(work: Path, total: int, piece: int) -> None:
    cache = BlockCache(work / "send", cap_bytes=4 * total + (1 << 30))
    digests = make_pieces(cache, total, piece)
    for d in digests:  # the CRC the agent keeps for a block it wrote (or checked once)
        cache.read(d, 0, piece)
    pieces = frozenset(digests)
    manifest = Manifest(len(digests) * piece, piece, tuple(digests))
    fetcher = Fetcher(cache, workers=1, timeout=60.0)  # every block is held: none fetched
    tags: set[int] = set()  # one connection: a request's tag names it

    def provide(req: PieceRequest, deadline: float) -> Any:  # the agent's, for a block
        tags.add(req.tag)
        if req.blocks:  # (Jobs.provide_block for a run)
            return provide_run(fetcher, NoStore(), manifest, req, deadline, 8 << 20)
        if req.piece not in pieces:
            raise PeerError("missing", "no piece of the job")
        data = cache.read(req.piece, 0, piece)
        if data is None:
            raise PeerError("missing", "not held here")
        return data

    def held(req: PieceRequest) -> Any:  # the agent's (Jobs.held_block)
        tags.add(req.tag)
        if req.blocks:
            return held_run(cache, manifest, req)
        where = cache.locate(req.piece) if req.piece in pieces else None
        if where is None:
            return None
        return HeldPiece(where.path, where.size, where.offset)

    fast = {"held": held} if HeldPiece is not None else {}  # the code before had none
    job = ServedJob(frozenset({"127.0.0.1"}), provide, **fast)
    server = PeerServer(("127.0.0.1", 0), SITE_KEY, {JOB: job}.get, lambda m: None)
    server.start()
    print(json.dumps({"port": server.port, "pieces": digests}), flush=True)
    c0 = cpu()
    sys.stdin.readline()  # the receiver is done
    used = since(c0)
    doc = {
        "cpu_s": sum(used),
        "sys_s": used[1],
        "served_bytes": server.served_bytes,
        "requests": len(tags),
    }
    print(json.dumps(doc), flush=True)
    server.close()
    fetcher.stop()


class NoStore:
    def read_block(self, index: int, digest: str, offset: int, length: int, prio: int) -> bytes:
        raise OSError("the bench has no store: every piece comes from the peer")

    def describe(self) -> str:
        return "no store"


def one_run(
    work: Path,
    total: int,
    piece: int,
    workers: int,
    recv_at: Path | None,
    run_kib: int = 0,
    fill: bool = False,
) -> dict[str, Any]:
    child = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--role",
            "sender",
            "--work",
            str(work),
            "--bytes",
            str(total),
            "--piece-kib",
            str(piece >> 10),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    recv_dir = (recv_at or work) / "bs-datapath-recv"
    try:
        assert child.stdout is not None and child.stdin is not None
        hello = json.loads(child.stdout.readline() or "{}")
        if "port" not in hello:
            raise SystemExit(f"the sender did not start (exit {child.wait()})")
        digests = hello["pieces"]
        shutil.rmtree(recv_dir, ignore_errors=True)
        cache = BlockCache(recv_dir, cap_bytes=4 * total + (1 << 30))
        client = PeerClient(timeout=30.0)
        swarm = Swarm(
            JOB,
            "receiver",
            NODES,
            job_token(SITE_KEY, JOB),
            lambda node: ("127.0.0.1", hello["port"]),
            client,
            print,
        )
        source = PeerSource(NoStore(), swarm)
        fetcher = Fetcher(cache, workers=workers, timeout=60.0)
        manifest = Manifest(len(digests) * piece, piece, tuple(digests))
        t0, c0 = time.monotonic(), cpu()
        if fill:
            filling = BackgroundFill(manifest.id)
            filling.start(fetcher, source, manifest, set(), run_kib << 10)
            while filling.ended is None:  # (the fill has no event; 20 looks a second)
                time.sleep(0.05)
            if filling.failed:
                raise SystemExit(f"the fill failed {filling.failed} blocks")
        else:  # the agent's prefetch of a hot set, all of it
            res = prefetch_hot(
                fetcher,
                source,
                manifest,
                range(len(digests)),
                time.monotonic() + 600,
                1.0,
                run_kib << 10,
            )
            if not res.complete:
                raise SystemExit(f"the prefetch failed {res.failed} blocks")
        seconds, (user, system) = time.monotonic() - t0, since(c0)
        load1 = os.getloadavg()[0]
        fetcher.stop()
        client.close()
        child.stdin.write("done\n")
        child.stdin.flush()
        served = json.loads(child.stdout.readline())
        child.wait(timeout=30)
        moved = len(digests) * piece
        if swarm.stats.peer_bytes != moved or any(d not in cache for d in digests):
            raise SystemExit(f"only {swarm.stats.peer_bytes} of {moved} bytes came from the peer")
        return {
            "bytes": moved,
            "pieces": len(digests),
            "piece_bytes": piece,
            "run_kib": run_kib,
            "fill": fill,
            "requests": served["requests"],
            "workers": workers,
            "receiver_cache": str(recv_dir.parent),
            "seconds": round(seconds, 3),
            "mb_s": round(moved / seconds / 1e6, 1),
            "sender_cpu_s_per_gib": round(served["cpu_s"] / (moved / GIB), 3),
            "receiver_cpu_s_per_gib": round((user + system) / (moved / GIB), 3),
            "sender_sys_share": round(served["sys_s"] / max(served["cpu_s"], 1e-9), 2),
            "receiver_sys_share": round(system / max(user + system, 1e-9), 2),
            "load1": round(load1, 2),
            # Run buffers the receiver made (the others were used again); None: before.
            "run_buffers_made": getattr(getattr(client, "buffers", None), "made", None),
        }
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        shutil.rmtree(recv_dir, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--role", choices=("receiver", "sender"), default="receiver")
    ap.add_argument("--work", type=Path)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--bytes", type=int)
    ap.add_argument("--piece-kib", type=int, default=256)
    ap.add_argument("--workers", type=int, default=16)  # the agent's fetch workers
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument(
        "--run-kib",
        default="0",
        help="the largest run asked in one request, KiB (0: a request per piece); "
        "several, comma-separated, are alternated round by round",
    )
    ap.add_argument(
        "--recv-dir",
        type=Path,
        help="where the receiver's cache goes (default: under --work); /dev/shm leaves "
        "out the file system's cost of writing the pieces",
    )
    ap.add_argument(
        "--fill", action="store_true", help="ask as the background fill does, not the prefetch"
    )
    ap.add_argument("--smoke", action="store_true", help="32 MiB, one run")
    ap.add_argument("--keep", action="store_true", help="keep the sender's pieces")
    ap.add_argument("--label", default="")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    total = a.bytes or (32 << 20 if a.smoke else int(a.gib * GIB))
    piece = a.piece_kib << 10
    if a.role == "sender":
        assert a.work is not None
        sender(a.work, total, piece)
        return
    own = a.work is None
    work = a.work or Path(tempfile.mkdtemp(prefix="bs-datapath-", dir="/var/tmp"))
    try:
        modes = [int(k) for k in str(a.run_kib).split(",")]
        runs = [
            one_run(work, total, piece, a.workers, a.recv_dir, k, a.fill)
            for _ in range(1 if a.smoke else a.runs)
            for k in modes
        ]
    finally:
        if own or not a.keep:
            shutil.rmtree(work / "send", ignore_errors=True)
        if own and not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    keys = ("seconds", "mb_s", "sender_cpu_s_per_gib", "receiver_cpu_s_per_gib", "load1")
    keys += ("requests",)
    median = {k: statistics.median(r[k] for r in runs) for k in keys}
    medians = {
        str(m): {k: statistics.median(r[k] for r in runs if r["run_kib"] == m) for k in keys}
        for m in modes
    }
    doc = {"label": a.label, "runs": runs, "median": median, "medians": medians}
    for r in runs:
        print(
            f"{r['bytes'] >> 20} MiB in {r['pieces']} pieces{' (fill)' if r['fill'] else ''}, "
            f"runs of {r['run_kib']} KiB, "
            f"{r['requests']} requests: {r['seconds']:.2f} s, "
            f"{r['mb_s']:.0f} MB/s, sender {r['sender_cpu_s_per_gib']:.2f} / receiver "
            f"{r['receiver_cpu_s_per_gib']:.2f} CPU-s/GiB, load1 {r['load1']}"
        )
    if a.json:
        a.json.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
