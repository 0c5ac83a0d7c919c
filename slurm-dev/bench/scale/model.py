#!/usr/bin/env python3
"""A scale model of startup against job size, fitted to the startup benchmark's points.

The startup benchmark (``slurm-dev/bench/startup/bench.py --json``) measures 1-16 nodes
on slurm-dev's network. This model says what those points imply for 1,000 and 10,000
nodes, for the baseline (every node pulls everything from the store) and for bootseer
(each piece leaves the store once per job; nodes exchange the rest over their own links)::

    slurm-dev/bench/scale/model.py startup.json [more.json ...] --store-mbit 100 \\
        --node-mbit 1000 [--baseline-from older.json] --plot docs/img/p2p-scale.png

Points of one N in several files are taken by their median. ``--baseline-from`` adds
only a file's baseline points (e.g. a run made before peer-to-peer: its baseline is the
same, its bootseer is not what the model describes).

The model, per variant, with E the bytes one node's start needs from the store at N = 1
(measured: the store egress of the N = 1 point), R_s and R_n the store's and a node's
link rates, F the time startup spends on anything but moving those bytes (fitted at
N = 1: CPU, mounts, imports, the install's own work):

- baseline:  T(N) = F_b + N * E_b / R_s         egress(N) = N * E_b
- bootseer:  T(N) = F_p + E_p / R_s + c * E_p * (N - 1) / N / R_n + X(N)
                                                 egress(N) = E_p
  where c (0..1) is the part of the peer exchange that does not overlap the store
  transfer, fitted to the measured N > 1 points (least squares, on slurm-dev's curve
  below). X(N) is the owner's fan-out: in the direct design only a piece's owner serves
  it, so the busiest owner sends ceil(m / N) * (N - 1) pieces of size P out of its own
  link for every kind of piece (``--pieces``: image blocks, snapshot frames, checkpoint
  units; m of them). While N <= m that is the even share E (N-1)/N already counted by
  the c term; X(N) is what it exceeds that by (kinds summed; zero at the measured N
  but for a fraction of a second for the snapshot's few frames). It assumes the askers
  keep every owner busy at once; nodes reading the same pieces in lockstep with a
  window of w pieces in flight would use only w owners' links (up to ceil(m / w) times
  X(N) for a kind).

On slurm-dev all N nodes share one machine's cores (``--cores``), so a start cannot be
shorter than the nodes' CPU work spread over them: the points are checked against
``max(T(N), N * C / cores)``, C the mean CPU-seconds per node of the measured points
(``cpu_s_per_node``, over the whole job; nothing fitted). On a real cluster every node
has its own cores: the predictions (``model s``, the plot's solid lines) are T(N).

It leaves out what 1-16 nodes cannot show: the store's own limits (request rate, disk),
a fabric's oversubscription, the O(N) peer connections every node keeps (a
connection's setup and memory, the server's cap), lockstep windows (above), and
the straggler tail that grows with N.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

MBIT = 1e6 / 8  # bytes per second in one Mbit/s
EFFICIENCY = 0.94  # payload over a tbf-capped link (measured: 75.2 of 80 Mbit/s)


@dataclass(frozen=True)
class Fit:
    fixed: float  # F, seconds
    egress: float  # E, bytes one node's start takes from the store at N = 1
    overlap_c: float  # c (bootseer only)
    cpu_s: float = 0.0  # C, CPU-seconds one node spends in a job (mean of the points)
    cores: float = 1.0  # the machine's, shared by all nodes of slurm-dev
    pieces: tuple[tuple[str, float, float], ...] = ()  # (kind, bytes, piece bytes)


# The benchmark's workload: the start's image blocks (58 MiB of 256 KiB), the snapshot
# (14 MiB in 8 zstd frames of 8 MiB unpacked), the checkpoint (128 MiB, 4 MiB units).
PIECES = "image:58:0.25,deps:14:1.75,ckpt:128:4"


def parse_pieces(spec: str) -> tuple[tuple[str, float, float], ...]:
    out = []
    for item in spec.split(","):
        kind, total, piece = item.split(":")
        out.append((kind, float(total) * 2**20, float(piece) * 2**20))
    return tuple(out)


def fanout_excess(pieces: tuple[tuple[str, float, float], ...], n: int, rn: float) -> float:
    """X(N): seconds the busiest owners' links need beyond an even share of the peer
    exchange (kinds summed)."""
    if n <= 1:
        return 0.0
    busiest = sum(
        math.ceil(math.ceil(total / piece) / n) * (n - 1) * piece for _, total, piece in pieces
    )
    even = sum(total for _, total, _ in pieces) * (n - 1) / n
    return max(0.0, busiest - even) / rn


def tree_excess(pieces: tuple[tuple[str, float, float], ...], n: int, rn: float) -> float:
    """X(N) with every holder serving (bootseer.p2p.tree): a piece's owner sends d =
    ceil(log2 N) copies, not N - 1, the other nodes relay theirs on ((N-1)/N copies
    each on average), and the last piece takes d store-and-forward hops of P / R_n."""
    if n <= 1:
        return 0.0
    d = math.ceil(math.log2(n))
    busiest = sum(
        math.ceil(math.ceil(total / piece) / n) * min(d, n - 1) * piece
        for _, total, piece in pieces
    )
    even = sum(total for _, total, _ in pieces) * (n - 1) / n
    hops = d * max((piece for _, _, piece in pieces), default=0.0)
    return (max(0.0, busiest - even) + hops) / rn


def median_by_n(rows: list[dict], variant: str, key: str) -> dict[int, float]:
    by: dict[int, list[float]] = {}
    for r in rows:
        if r.get("variant") == variant and r.get(key) is not None:
            by.setdefault(int(r["nodes"]), []).append(float(r[key]))
    return {n: statistics.median(v) for n, v in sorted(by.items())}


def fit(
    rows: list[dict], variant: str, rs: float, rn: float, cores: float, pieces: tuple = ()
) -> Fit:
    t = median_by_n(rows, variant, "startup_s")
    e = median_by_n(rows, variant, "store_egress_bytes")
    if 1 not in t or 1 not in e:
        raise SystemExit(f"model: no N = 1 point for {variant}")
    egress = e[1]
    fixed = t[1] - egress / rs
    cpu = median_by_n(rows, variant, "cpu_s_per_node")
    cpu_s = statistics.mean(cpu.values()) if cpu else 0.0
    f = Fit(fixed, egress, 0.0, cpu_s, cores, pieces)
    if variant == "baseline":
        return f

    # c by least squares over the N > 1 points on slurm-dev's curve (on a grid: the
    # max() makes the error piecewise in c).
    def sse(c: float) -> float:
        g = replace(f, overlap_c=c)
        return sum((predict(g, variant, n, rs, rn, on_dev=True)[0] - t[n]) ** 2 for n in t if n > 1)

    return replace(f, overlap_c=min((i / 100 for i in range(101)), key=sse))


def predict(
    f: Fit, variant: str, n: int, rs: float, rn: float, on_dev: bool = False
) -> tuple[float, float]:
    """(startup seconds, store egress bytes until the last first step) at ``n`` nodes; with
    ``on_dev``, on slurm-dev (all nodes on one machine's cores)."""
    cpu_bound = n * f.cpu_s / f.cores if on_dev else 0.0
    if variant == "baseline":
        return max(f.fixed + n * f.egress / rs, cpu_bound), n * f.egress
    secs = f.fixed + f.egress / rs + f.overlap_c * f.egress * (n - 1) / n / rn
    excess = tree_excess if variant == "tree" else fanout_excess
    secs += excess(f.pieces, n, rn)
    return max(secs, cpu_bound), f.egress


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("points", type=Path, nargs="+", help="the startup benchmark's --json output")
    p.add_argument(
        "--baseline-from",
        type=Path,
        action="append",
        default=[],
        help="also take the baseline's points (only) from this --json output",
    )
    p.add_argument("--store-mbit", type=float, default=100)
    p.add_argument("--node-mbit", type=float, default=1000)
    p.add_argument("--at", default="1,2,4,8,16,64,256,1000,10000", help="N to predict")
    p.add_argument("--plot", type=Path, help="write startup against job size here (PNG)")
    p.add_argument(
        "--cores",
        type=float,
        default=os.cpu_count() or 1,
        help="cores all of slurm-dev's nodes shared (default: this machine's, %(default)s)",
    )
    p.add_argument(
        "--pieces",
        default=PIECES,
        help="bootseer's pieces as kind:MiB:piece MiB,... (default: the benchmark's, %(default)s)",
    )
    args = p.parse_args(argv)
    rows = [r for f in args.points for r in json.loads(f.read_text())]
    rows += [
        r
        for f in args.baseline_from
        for r in json.loads(f.read_text())
        if r.get("variant") == "baseline"
    ]
    rs, rn = args.store_mbit * MBIT * EFFICIENCY, args.node_mbit * MBIT * EFFICIENCY
    pieces = parse_pieces(args.pieces)
    fits = {
        v: fit(rows, v, rs, rn, args.cores, pieces if v == "bootseer" else ())
        for v in ("baseline", "bootseer")
    }
    # The tree (issue 20): bootseer's fit, every holder serving (no Slurm points of it yet).
    fits["tree"] = fits["bootseer"]
    measured = {v: median_by_n(rows, v, "startup_s") for v in fits}
    for v, f in fits.items():
        print(
            f"{v}: F = {f.fixed:.1f} s, E = {f.egress / 2**20:.0f} MiB"
            + (
                f", c = {f.overlap_c:.2f}, C = {f.cpu_s:.1f} CPU-s/node on {f.cores:g} cores"
                if v != "baseline"
                else f", C = {f.cpu_s:.1f} CPU-s/node"
            )
        )
    print(
        f"\n{'nodes':>6} {'variant':>9} {'measured s':>11} {'on slurm-dev':>13} {'error':>7} "
        f"{'model s':>9} {'egress GiB':>11}"
    )
    errors: dict[str, list[float]] = {v: [] for v in fits}
    for n in [int(x) for x in args.at.split(",")]:
        for v, f in fits.items():
            secs, egress = predict(f, v, n, rs, rn)
            here, _ = predict(f, v, n, rs, rn, on_dev=True)
            got = measured[v].get(n)
            err = "" if got is None else f"{(here - got) / got:+.0%}"
            if got is not None and n > 1:
                errors[v].append(abs(here - got) / got)
            shown, on_dev = ("", "") if got is None else (f"{got:.1f}", f"{here:.1f}")
            print(
                f"{n:>6} {v:>9} {shown:>11} {on_dev:>13} {err:>7} {secs:>9.1f} "
                f"{egress / 2**30:>11.2f}"
            )
    every = [e for v in errors.values() for e in v]
    if every:
        print(
            "\nmean |error| over the measured N > 1 points: "
            + ", ".join(f"{v} {statistics.mean(e):.0%}" for v, e in errors.items() if e)
            + f"; both {statistics.mean(every):.0%} (max {max(every):.0%})"
        )
    if args.plot:
        plot(args.plot, fits, measured, rs, rn)
    return 0


def plot(
    out: Path, fits: dict[str, Fit], measured: dict[str, dict[int, float]], rs: float, rn: float
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = sorted({round(10 ** (k / 8)) for k in range(0, 33)})
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(
        ns,
        [predict(fits["tree"], "tree", n, rs, rn)[0] for n in ns],
        color="tab:green",
        label="bootseer, every holder serving (tree), model",
    )
    for v, color in (("baseline", "tab:red"), ("bootseer", "tab:blue")):
        label = f"{v}, model" if v == "baseline" else "bootseer, owner serves all (direct), model"
        ax.plot(ns, [predict(fits[v], v, n, rs, rn)[0] for n in ns], color=color, label=label)
        pts = measured[v]
        if v == "bootseer":
            few = sorted({n for n in ns if n <= max(pts)} | set(pts))
            ax.plot(
                few,
                [predict(fits[v], v, n, rs, rn, on_dev=True)[0] for n in few],
                "--",
                color=color,
                label=f"{v}, model on slurm-dev ({fits[v].cores:g} shared cores)",
            )
        ax.plot(list(pts), list(pts.values()), "o", color=color, label=f"{v}, measured")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("nodes in the job")
    ax.set_ylabel("startup (s): allocation to the last node's first step")
    ax.set_title(
        f"Startup against job size (store link {rs / MBIT / EFFICIENCY:.0f} Mbit/s, "
        f"node links {rn / MBIT / EFFICIENCY:.0f} Mbit/s)",
        fontsize=9,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"plot: {out}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
