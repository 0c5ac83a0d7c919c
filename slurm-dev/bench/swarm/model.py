#!/usr/bin/env python3
"""The scale model of issue 20, calibrated on the emulator's points (``bench.py``).

Two halves. **The emulator's time** (``all_hold_s``: every live node holds every piece)
is modelled from the emulator's own links and piece set, with one parameter fitted to
the emulated points (the per-hop latency) and one measured (the straggler spread)::

    T_emu(N) = max(S / R_s + hops, U(N) / R_n + hops, W(N), N C / K) (1 + tail(N))
    hops = d (P / R_n + lam)

- S / R_s: the store sends each piece once (S the bytes on its link, framing included,
  measured as the records' ``store_egress_bytes``);
- U(N) / R_n: the busiest node's link: in the tree (``bootseer.p2p.tree``) a node sends
  (N-1)/N copies of each piece on average, the owner of a piece d = ceil(log2 N);
- W(N): the read windows: a node keeps w pieces of a kind in flight (16 blocks, 4
  frames, 16 units) and all nodes read them in the same order, so a kind of m pieces
  needs at least m/w rounds of one piece's trip down the tree, d (P / R_n + lam) each;
- N C / K: the emulator's nodes share K = 2 cores (C the CPU-seconds per node, measured);
  a real cluster's nodes do not: the predictions leave it out;
- d (P / R_n + lam): the last piece's trip, d store-and-forward hops, ``lam`` each on top
  of the transfer (request, the relay's wait for the whole piece, scheduling; the
  connection's set-up is in it for a node's first piece from a parent, one handshake per
  peer: ``handshakes_per_node``). ``lam`` is fitted (least squares) to the points the CPU
  floor does not set; with the run's start-up in it too, it is an upper bound;
- tail(N) = sigma sqrt(2 ln N): the slowest of N nodes, sigma from the measured spread of
  the nodes' finish times (``OUT.detail.json``: (max - median) / sqrt(2 ln N), mean over
  the points), as a fraction of the median node's time.

**Startup on real links** then takes issue 10's startup model (``slurm-dev/bench/scale/
model.py``, fitted to slurm-dev's 1-16 node Slurm points: F = 3.1 s, E = 210 MiB, c =
1.00, F kept on every link: CPU, mounts) and adds the emulator's terms on those links:
the tree's excess and hops, the windows, the per-hop latency and the straggler tail's
growth from 16 nodes on::

    T(N) = F + E / R_s + c E (N-1)/N / R_n + X_tree(N) + max(0, W(N) - E / R_s)
           + d lam' + sigma T_16ish (sqrt(2 ln N) - sqrt(2 ln 16))

(T_16ish: F and the transfer terms, the time the tail is a fraction of).

lam' is a real node's per-hop latency (``--hop-ms``, 2 ms: the data path's CPU per
piece on both sides, ``slurm-dev/bench/p2p/datapath.py``, and a fabric's round trip);
the emulator's fitted ``lam`` (its 2 cores shared by all nodes and other work, so
mostly waiting for a CPU) is shown beside it as a pessimistic bound::

    model.py after.json --detail after.detail.json --plot docs/img/p2p-emulated-scale.png
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

MBIT = 1e6 / 8
EFFICIENCY = 0.94  # payload over a tbf-capped link (measured on slurm-dev)
MiB = 2**20


@dataclass(frozen=True)
class Kind:
    name: str
    count: int
    size: float  # bytes
    window: int  # in flight per node (node.py's readers, the agent's windows)


# The bench job (bench.py's ``bench`` shape), unscaled.
BENCH = (
    Kind("block", 232, 256 * 1024, 16),
    Kind("frame", 8, 14 * MiB / 8, 4),
    Kind("unit", 32, 4 * MiB, 16),
)


@dataclass(frozen=True)
class Links:
    name: str
    store_mbit: float
    node_mbit: float
    # Payload over the link's rate: 0.94 for a piece's bytes on a tbf link; the emulator's
    # store egress is counted on the wire (framing in it), so 1.0 there.
    efficiency: float = EFFICIENCY

    @property
    def rs(self) -> float:
        return self.store_mbit * MBIT * self.efficiency

    @property
    def rn(self) -> float:
        return self.node_mbit * MBIT * self.efficiency


def depth(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


def busiest_upload(kinds: tuple[Kind, ...], n: int) -> float:
    """Bytes the busiest node sends in the tree: the even share, plus what owning
    ceil(m/N) pieces of a kind (d copies each) adds beyond it."""
    if n <= 1:
        return 0.0
    d = depth(n)
    even = sum(k.count * k.size for k in kinds) * (n - 1) / n
    owner = sum(math.ceil(k.count / n) * min(d, n - 1) * k.size for k in kinds)
    return max(even, owner)


def tree_excess(kinds: tuple[Kind, ...], n: int, rn: float) -> float:
    """X_tree(N) of the startup model (scale/model.py's tree_excess)."""
    if n <= 1:
        return 0.0
    d = depth(n)
    even = sum(k.count * k.size for k in kinds) * (n - 1) / n
    owner = sum(math.ceil(k.count / n) * min(d, n - 1) * k.size for k in kinds)
    return (max(0.0, owner - even) + d * max(k.size for k in kinds)) / rn


def windows(kinds: tuple[Kind, ...], n: int, rn: float, lam: float) -> float:
    """W(N): the kinds' rounds of in-flight windows, each a trip down the tree."""
    d = depth(n)
    return sum(math.ceil(k.count / k.window) * d * (k.size / rn + lam) for k in kinds)


def tail_factor(n: int) -> float:
    return math.sqrt(2 * math.log(n)) if n > 1 else 0.0


@dataclass(frozen=True)
class Emulated:
    """The emulator's setting and what was fitted or measured on its points."""

    kinds: tuple[Kind, ...]  # scaled
    links: Links
    framing: float  # store link bytes / piece bytes, measured
    cores: float
    lam: float = 0.0  # per-hop latency, emulator seconds (fitted)
    sigma_rel: float = 0.0  # straggler spread over the median node's time (measured)

    def parts(self, n: int, cpu_s: float) -> dict[str, float]:
        rs, rn = self.links.rs, self.links.rn
        piece_bytes = sum(k.count * k.size for k in self.kinds)
        d = depth(n)
        return {
            "store": piece_bytes * self.framing / rs,
            "upload": busiest_upload(self.kinds, n) / rn,
            "windows": windows(self.kinds, n, rn, self.lam),
            "cpu": n * cpu_s / self.cores,
            "hops": d * (max(k.size for k in self.kinds) / rn + self.lam),
        }

    def predict(self, n: int, cpu_s: float) -> tuple[float, str]:
        """(seconds, what bounds them): the links' time with the last piece's hops, or
        the windows' rounds, or the CPU floor, whichever is longest; the tail on top."""
        p = self.parts(n, cpu_s)
        bounds = {
            "store": p["store"] + p["hops"],
            "upload": p["upload"] + p["hops"],
            "windows": p["windows"],
            "cpu": p["cpu"],
        }
        bound = max(bounds, key=bounds.__getitem__)
        return bounds[bound] * (1 + self.sigma_rel * tail_factor(n)), bound


def load(paths: list[Path]) -> list[dict]:
    return [r for p in paths for r in json.loads(p.read_text())]


def calibrate(records: list[dict], details: list[dict], em: Emulated) -> Emulated:
    pts = [r for r in records if r["engine"] == "tree" and r["faults"] == "none"]
    pts = [r for r in pts if r["all_hold_s"] is not None]
    framing = statistics.median(r["store_egress_bytes"] / r["piece_bytes"] for r in pts)
    spreads = []
    for d in details:
        if d.get("faults") == "none" and d.get("hold_s_min_median_p90_max"):
            _, median, _, worst = d["hold_s_min_median_p90_max"]
            spreads.append((worst - median) / median / tail_factor(d["nodes"]))
    sigma_rel = statistics.mean(spreads) if spreads else 0.0
    em = Emulated(em.kinds, em.links, framing, em.cores, 0.0, sigma_rel)

    # lam from the points the CPU floor does not set (it says nothing about the others).
    free = [r for r in pts if em.predict(r["nodes"], r["cpu_s_per_node"])[1] != "cpu"]

    def sse(lam: float) -> float:
        e = Emulated(em.kinds, em.links, framing, em.cores, lam, sigma_rel)
        return sum((e.predict(r["nodes"], r["cpu_s_per_node"])[0] - r["all_hold_s"]) ** 2
                   for r in free)  # fmt: skip

    lam = min((i / 100 for i in range(0, 501)), key=sse)  # 0-5 s on a 10 ms grid
    return Emulated(em.kinds, em.links, framing, em.cores, lam, sigma_rel)


@dataclass(frozen=True)
class Startup:
    """Issue 10's fit on slurm-dev (scale/model.py), carried to other links."""

    fixed: float = 3.1  # F, s
    egress: float = 210 * MiB  # E
    overlap_c: float = 1.0


def startup(st: Startup, em: Emulated, kinds: tuple[Kind, ...], links: Links, n: int,
            lam_real: float) -> float:  # fmt: skip
    rs, rn = links.rs, links.rn
    d = depth(n)
    xfer = st.egress / rs + st.overlap_c * st.egress * (n - 1) / n / rn + tree_excess(kinds, n, rn)
    xfer += max(0.0, windows(kinds, n, rn, lam_real) - st.egress / rs) + d * lam_real
    tail = em.sigma_rel * (xfer + st.fixed) * (tail_factor(n) - tail_factor(16))
    return st.fixed + xfer + max(0.0, tail)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", type=Path, nargs="+", help="bench.py --json output")
    ap.add_argument("--detail", type=Path, action="append", default=[], help="OUT.detail.json")
    ap.add_argument("--scale", type=int, default=64)
    ap.add_argument("--store-mbit", type=float, default=0.4)
    ap.add_argument("--node-mbit", type=float, default=4.0)
    ap.add_argument("--cores", type=float, default=2.0)
    ap.add_argument("--at", default="16,64,128,256,1000,10000")
    ap.add_argument(
        "--hop-ms", type=float, default=2.0,
        help="per-hop latency on a real node (ms): the data path's CPU per piece, both "
        "sides (slurm-dev/bench/p2p/datapath.py: 1.3 + 0.3 ms a 256 KiB piece), and a RTT",
    )  # fmt: skip
    ap.add_argument("--plot", type=Path)
    a = ap.parse_args(argv)
    records, details = load(a.records), load(a.detail)
    scaled = tuple(Kind(k.name, k.count, max(1, k.size // a.scale), k.window) for k in BENCH)
    links = Links("emulator", a.store_mbit, a.node_mbit, 1.0)
    em = calibrate(records, details, Emulated(scaled, links, 1.0, a.cores))
    print(f"emulator: framing {em.framing:.3f}x, lam = {em.lam:.2f} s a hop (fitted), "
          f"stragglers sigma = {em.sigma_rel:.2%} of the median node's time")  # fmt: skip
    pts = [r for r in records if r["engine"] == "tree" and r["faults"] == "none"]
    cpu = {r["nodes"]: r["cpu_s_per_node"] for r in pts if r["cpu_s_per_node"]}
    cpu_mean = statistics.mean(cpu.values())
    free = Emulated(em.kinds, em.links, em.framing, 1e9, em.lam, em.sigma_rel)
    print(f"\n{'N':>6} {'measured s':>10} {'load1':>7} {'model s':>8} {'bound':>8} "
          f"{'error':>6} {'a core per node':>16}")  # fmt: skip
    for n in [int(x) for x in a.at.split(",")]:
        got = [r for r in pts if r["nodes"] == n and r["all_hold_s"] is not None]
        secs, bound = em.predict(n, cpu.get(n, cpu_mean))
        own, own_bound = free.predict(n, 0.0)
        for r in got or [None]:
            shown = f"{r['all_hold_s']:.1f}" if r else ""
            err = f"{(secs - r['all_hold_s']) / r['all_hold_s']:+.0%}" if r else ""
            load1 = r["load1"] if r else ""
            print(f"{n:>6} {shown:>10} {load1:>7} {secs:>8.1f} {bound:>8} {err:>6} "
                  f"{own:>8.1f} {own_bound:>7}")  # fmt: skip
    real = [
        Links("slurm-dev", 100, 1000),
        Links("100G nodes, 200G store", 200_000, 100_000),
        Links("400G nodes, 400G store", 400_000, 400_000),
    ]
    st = Startup()
    lams = {f"{a.hop_ms:g} ms": a.hop_ms / 1e3, f"emulator's {em.lam:.2f} s": em.lam}
    print("\nstartup (s), the tree, predicted:")
    head = f"{'links':>24} {'per hop':>18}" + "".join(f"{n:>9}" for n in (16, 1000, 10000))
    print(head + f"{'10k / 16':>10}")
    for links in real:
        for lname, lam in lams.items():
            t = [startup(st, em, BENCH, links, n, lam) for n in (16, 1000, 10000)]
            print(f"{links.name:>24} {lname:>18}" + "".join(f"{x:>9.1f}" for x in t)
                  + f"{t[2] / t[0]:>9.2f}x")  # fmt: skip
    print("\nper-hop latency at which 10,000 nodes take 1.5x of 16 (the read windows bind):")
    for links in real:
        lo, hi = 0.0, 5.0
        for _ in range(40):
            mid = (lo + hi) / 2
            big, small = (startup(st, em, BENCH, links, n, mid) for n in (10000, 16))
            ratio = big / small
            lo, hi = (mid, hi) if ratio < 1.5 else (lo, mid)
        print(f"{links.name:>24} {lo * 1e3:>8.0f} ms")
    if a.plot:
        plot(a.plot, em, pts, cpu_mean, st, real, a.hop_ms / 1e3)
    return 0


def plot(out: Path, em: Emulated, pts: list[dict], cpu_mean: float, st: Startup,
         real: list[Links], hop: float) -> None:  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = sorted({round(2 ** (k / 4)) for k in range(16, 4 * 14 + 1)})  # 16 to 16,384
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.plot(ns, [em.predict(n, cpu_mean)[0] for n in ns], color="tab:green",
              label="model, 2 shared cores")  # fmt: skip
    free = Emulated(em.kinds, em.links, em.framing, 1e9, em.lam, em.sigma_rel)
    left.plot(ns, [free.predict(n, cpu_mean)[0] for n in ns], "--", color="tab:green",
              label="model, a core per node")  # fmt: skip
    left.plot([r["nodes"] for r in pts if r["all_hold_s"]],
              [r["all_hold_s"] for r in pts if r["all_hold_s"]], "o", color="k",
              label="emulated (tree)")  # fmt: skip
    left.set_title(f"Emulator: all hold (store {em.links.store_mbit:g} Mbit/s, "
                   f"nodes {em.links.node_mbit:g} Mbit/s)", fontsize=9)  # fmt: skip
    left.set_ylabel("seconds until every node holds every piece")
    colors = ("tab:blue", "tab:orange", "tab:purple")
    for links, color in zip(real, colors, strict=True):
        right.plot(ns, [startup(st, em, BENCH, links, n, hop) for n in ns],
                   color=color, label=links.name)  # fmt: skip
        right.plot(ns, [startup(st, em, BENCH, links, n, em.lam) for n in ns], ":",
                   color=color)  # fmt: skip
    right.set_title(f"Startup predicted, the tree: {hop * 1e3:g} ms a hop (dotted: the "
                    f"emulator's {em.lam:.2f} s)", fontsize=9)  # fmt: skip
    right.set_ylabel("startup (s): allocation to the last node's first step")
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("nodes in the job")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    print(f"plot: {out}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
