#!/usr/bin/env python3
"""A scale model of startup against job size, fitted to the startup benchmark's points.

The startup benchmark (``slurm-dev/bench/startup/bench.py --json``) measures 1-16 nodes
on slurm-dev's network. This model says what those points imply for 1,000 and 10,000
nodes, for the baseline (every node pulls everything from the store) and for bootseer
(each piece leaves the store once per job; nodes exchange the rest over their own links)::

    slurm-dev/bench/scale/model.py startup.json --store-mbit 100 --node-mbit 1000 \\
        --plot docs/img/p2p-scale.png

The model, per variant, with E the bytes one node's start needs from the store at N = 1
(measured: the store egress of the N = 1 point), R_s and R_n the store's and a node's
link rates, F the time startup spends on anything but moving those bytes (fitted at
N = 1: CPU, mounts, imports, the install's own work):

- baseline:  T(N) = F_b + N * E_b / R_s         egress(N) = N * E_b
- bootseer:  T(N) = F_p + E_p / R_s + c * E_p * (N - 1) / N / R_n
                                                 egress(N) = E_p
  where c (0..1) is the part of the peer exchange that does not overlap the store
  transfer, fitted to the measured N > 1 points by least squares.

It leaves out what 1-16 nodes cannot show: the store's own limits (request rate, disk),
a fabric's oversubscription, and the straggler tail that grows with N; the error it
makes on the measured points is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

MBIT = 1e6 / 8  # bytes per second in one Mbit/s
EFFICIENCY = 0.94  # payload over a tbf-capped link (measured: 75.2 of 80 Mbit/s)


@dataclass(frozen=True)
class Fit:
    fixed: float  # F, seconds
    egress: float  # E, bytes one node's start takes from the store at N = 1
    overlap_c: float  # c (bootseer only)


def median_by_n(rows: list[dict], variant: str, key: str) -> dict[int, float]:
    by: dict[int, list[float]] = {}
    for r in rows:
        if r.get("variant") == variant and r.get(key) is not None:
            by.setdefault(int(r["nodes"]), []).append(float(r[key]))
    return {n: statistics.median(v) for n, v in sorted(by.items())}


def fit(rows: list[dict], variant: str, rs: float, rn: float) -> Fit:
    t = median_by_n(rows, variant, "startup_s")
    e = median_by_n(rows, variant, "store_egress_bytes")
    if 1 not in t or 1 not in e:
        raise SystemExit(f"model: no N = 1 point for {variant}")
    egress = e[1]
    fixed = t[1] - egress / rs
    if variant == "baseline":
        return Fit(fixed, egress, 0.0)
    # Least squares for c over the N > 1 points: t - F - E/Rs = c * E (N-1)/N / Rn.
    xs = [(egress * (n - 1) / n / rn, t[n] - fixed - egress / rs) for n in t if n > 1]
    den = sum(x * x for x, _ in xs)
    c = sum(x * y for x, y in xs) / den if den else 0.0
    return Fit(fixed, egress, min(1.0, max(0.0, c)))


def predict(f: Fit, variant: str, n: int, rs: float, rn: float) -> tuple[float, float]:
    """(startup seconds, store egress bytes until the last first step) at ``n`` nodes."""
    if variant == "baseline":
        return f.fixed + n * f.egress / rs, n * f.egress
    return f.fixed + f.egress / rs + f.overlap_c * f.egress * (n - 1) / n / rn, f.egress


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("points", type=Path, help="the startup benchmark's --json output")
    p.add_argument("--store-mbit", type=float, default=100)
    p.add_argument("--node-mbit", type=float, default=1000)
    p.add_argument("--at", default="1,2,4,8,16,64,256,1000,10000", help="N to predict")
    p.add_argument("--plot", type=Path, help="write startup against job size here (PNG)")
    args = p.parse_args(argv)
    rows = json.loads(args.points.read_text())
    rs, rn = args.store_mbit * MBIT * EFFICIENCY, args.node_mbit * MBIT * EFFICIENCY
    fits = {v: fit(rows, v, rs, rn) for v in ("baseline", "bootseer")}
    measured = {v: median_by_n(rows, v, "startup_s") for v in fits}
    for v, f in fits.items():
        print(
            f"{v}: F = {f.fixed:.1f} s, E = {f.egress / 2**20:.0f} MiB"
            + (f", c = {f.overlap_c:.2f}" if v == "bootseer" else "")
        )
    print(
        f"\n{'nodes':>6} {'variant':>9} {'measured s':>11} {'model s':>9} {'error':>7} "
        f"{'egress GiB':>11}"
    )
    errors = []
    for n in [int(x) for x in args.at.split(",")]:
        for v, f in fits.items():
            secs, egress = predict(f, v, n, rs, rn)
            got = measured[v].get(n)
            err = "" if got is None else f"{(secs - got) / got:+.0%}"
            if got is not None and n > 1:
                errors.append(abs(secs - got) / got)
            shown = "" if got is None else f"{got:.1f}"
            print(f"{n:>6} {v:>9} {shown:>11} {secs:>9.1f} {err:>7} {egress / 2**30:>11.2f}")
    if errors:
        print(f"\nmean |error| over the measured N > 1 points: {statistics.mean(errors):.0%}")
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
    for v, color in (("baseline", "tab:red"), ("bootseer", "tab:blue")):
        ax.plot(
            ns, [predict(fits[v], v, n, rs, rn)[0] for n in ns], color=color, label=f"{v}, model"
        )
        pts = measured[v]
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
