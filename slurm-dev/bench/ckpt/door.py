"""What the checkpoint door costs: a user's ``bootseer ckpt put|get`` through the node
agent against root's, which writes the targets itself.

One real agent (``bootseer agent``, as a node runs it) and two ``file://`` targets under
``--state-dir``. Each round puts and gets the same file of ``--mib`` MiB with both
commands, the variants alternating (and their order flipped every round) so that the
machine's load falls on both alike; the figures are medians over ``--reps`` rounds and
the ratio door/direct, with the load average before and after.

    $BOOTSEER_VENV/bin/python slurm-dev/bench/ckpt/door.py --smoke    # 32 MiB, 3 rounds
    $BOOTSEER_VENV/bin/python slurm-dev/bench/ckpt/door.py            # 512 MiB, 7 rounds

Runs as root, the door's side as ``--user`` (default alice, whom slurm-dev creates).
The agent is stopped by its pid, its mount detached and ``--state-dir`` removed at the
end, even on failure. The targets sit on the local disk, in the page cache: this
measures the door's own cost (the socket, the descriptor, the agent's copy loop), not
a storage system's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

TOP = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(TOP / "lib"))

from bootseer import mounts  # noqa: E402

BOOTSEER = str(Path(sys.executable).parent / "bootseer")
MiB = 1 << 20


def config(state: Path) -> Path:
    key = state / "site.key"
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32).hex().encode() + b"\n")
    os.close(fd)
    for root in ("store", "t1", "t2"):  # a store's root is the site's to make
        (state / root).mkdir(exist_ok=True)
    path = state / "config.toml"
    path.write_text(
        f'[site]\nkey_file = "{key}"\n'
        f'[store]\nuri = "file://{state}/store"\n'
        f'[paths]\nrun_dir = "{state}/%n/run"\ncache_dir = "{state}/%n/cache"\n'
        f'log_dir = "{state}/log"\n'
        f'[image]\nsocket = "{state}/%n/agent.sock"\nmount_dir = "{state}/%n/mnt"\n'
        f'[ckpt]\ntargets = ["file://{state}/t1", "file://{state}/t2"]\n'
    )
    path.chmod(0o644)
    return path


@contextlib.contextmanager
def agent(state: Path, cfg: Path, node: str) -> Iterator[None]:
    env = {**os.environ, "BOOTSEER_CONFIG": str(cfg)}
    err = open(state / "agent.err", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [BOOTSEER, "agent", "--node", node], env=env, stdout=subprocess.DEVNULL, stderr=err
    )
    sock = state / node / "agent.sock"
    try:
        t_end = time.monotonic() + 30
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > t_end:
                raise SystemExit(
                    f"bench: the agent did not start: {(state / 'agent.err').read_text()}"
                )
            time.sleep(0.1)
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        err.close()
        mnt = state / node / "mnt"
        if mounts.is_mounted(mnt):
            mounts.umount(mnt, lazy=True)


def ckpt(cfg: Path, node: str, user: str | None, *argv: str) -> float:
    """Seconds one ``bootseer ckpt ARGV`` took, run as ``user`` (None: root)."""
    who = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups"] if user else []
    cmd = [*who, "env", f"BOOTSEER_CONFIG={cfg}", f"SLURMD_NODENAME={node}", BOOTSEER]
    t0 = time.perf_counter()
    r = subprocess.run([*cmd, "ckpt", "-q", *argv], capture_output=True, text=True)
    took = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"bench: ckpt {' '.join(argv)} as {user or 'root'}: {r.stderr.strip()}")
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--user", default="alice")
    ap.add_argument("--state-dir", default="/var/tmp/bootseer-bench-door")
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--smoke", action="store_true", help="32 MiB, 3 rounds")
    args = ap.parse_args()
    if args.smoke:
        args.mib, args.reps = 32, 3
    if os.geteuid() != 0:
        raise SystemExit("bench: run as root (the agent, and the user's side through setpriv)")
    pw = pwd.getpwnam(args.user)
    state = Path(args.state_dir)
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    state.chmod(0o755)
    node = "b1"
    try:
        cfg = config(state)
        home = state / "home"
        home.mkdir(mode=0o700)
        os.chown(home, pw.pw_uid, pw.pw_gid)
        src = home / "model.bin"
        with open(src, "wb") as f:
            for _ in range(args.mib):
                f.write(os.urandom(MiB))
        os.chown(src, pw.pw_uid, pw.pw_gid)
        times: dict[str, list[float]] = {
            k: [] for k in ("put door", "put direct", "get door", "get direct")
        }
        load0 = os.getloadavg()
        with agent(state, cfg, node):
            for rep in range(args.reps):
                order = [("door", args.user), ("direct", None)]
                for variant, user in order if rep % 2 == 0 else order[::-1]:
                    out = home / f"back-{variant}.bin"
                    times[f"put {variant}"].append(
                        ckpt(
                            cfg,
                            node,
                            user,
                            *(["--user", args.user] if not user else []),
                            "put",
                            str(src),
                            f"bench:{variant}.bin",
                        )
                    )
                    times[f"get {variant}"].append(
                        ckpt(
                            cfg,
                            node,
                            user,
                            *(["--user", args.user] if not user else []),
                            "get",
                            f"bench:{variant}.bin",
                            str(out),
                        )
                    )
                    if out.stat().st_size != src.stat().st_size:
                        raise SystemExit(f"bench: {out} has the wrong size")
                    out.unlink()
        load1 = os.getloadavg()
        med = {k: statistics.median(v) for k, v in times.items()}
        result = {
            "mib": args.mib,
            "reps": args.reps,
            "median_seconds": med,
            "mb_per_s": {k: args.mib * MiB / v / 1e6 for k, v in med.items()},
            "door_over_direct": {
                op: med[f"{op} door"] / med[f"{op} direct"] for op in ("put", "get")
            },
            "loadavg_before": load0,
            "loadavg_after": load1,
            "cpus": os.cpu_count(),
        }
        print(
            f"{args.mib} MiB, {args.reps} rounds, medians "
            f"(load {load0[0]:.1f} -> {load1[0]:.1f} on {os.cpu_count()} CPUs)"
        )
        for op in ("put", "get"):
            d, r = med[f"{op} door"], med[f"{op} direct"]
            print(
                f"  {op}: door {d:.2f} s ({args.mib * MiB / d / 1e6:.0f} MB/s), "
                f"root direct {r:.2f} s ({args.mib * MiB / r / 1e6:.0f} MB/s), "
                f"door/direct {d / r:.2f}"
            )
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    finally:
        shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
