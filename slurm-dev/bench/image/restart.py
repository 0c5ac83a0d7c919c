"""How long a node agent's restart keeps a prolog waiting: in place (``restart`` request:
the same process runs its program again, its listening socket inherited) against a stop
and a start (what ``systemctl restart`` does), alternating in one loop so both see the
same machine; for each, the time from the request to the first ``ping`` the new agent
answers, and how many pings sent every 10 ms meanwhile found no agent. Medians, their
ratio, and the machine's load. Needs root and /dev/fuse (the agent mounts its FUSE
filesystem); loopback only.

    python3 slurm-dev/bench/image/restart.py [--runs 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bootseer.agentapi.client import AgentClient
from bootseer.agentapi.errors import AgentError, AgentUnavailable
from bootseer.agentapi.jobs import AgentRestart, Ping

CMD = [sys.executable, "-c", "import sys; from bootseer.cli import main; sys.exit(main())"]


def config(base: Path) -> Path:
    path = base / "config.toml"
    (base / "store").mkdir(exist_ok=True)  # a store's root is the site's to make
    path.write_text(
        f'[store]\nuri = "file://{base}/store"\n'
        f'[paths]\nrun_dir = "{base}/run"\ncache_dir = "{base}/cache"\nlog_dir = "{base}/log"\n'
        f'[image]\nsocket = "{base}/agent.sock"\nmount_dir = "{base}/mnt"\n'
    )
    return path


class Pinger:
    """Pings every 10 ms until stopped: the first answer from an agent started after
    ``since``, and how many pings found no agent."""

    def __init__(self, client: AgentClient, before: float) -> None:
        self.client = client
        self.before = before
        self.unavailable = 0
        self.answered_at: float | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Pinger:
        self._thread.start()
        return self

    def _run(self) -> None:
        while self.answered_at is None:
            try:
                if self.client.ask(Ping(), timeout=60).started != self.before:
                    self.answered_at = time.perf_counter()
                    return
            except AgentUnavailable:
                self.unavailable += 1
            except AgentError:
                pass
            time.sleep(0.01)

    def wait(self) -> None:
        self._thread.join(timeout=120)


def start_agent(cfg: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "BOOTSEER_CONFIG": str(cfg)}
    return subprocess.Popen(
        [*CMD, "agent", "--node", "b1"], env=env, stdout=subprocess.DEVNULL, stderr=open(log, "ab")
    )


def wait_up(client: AgentClient) -> float:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            return client.ask(Ping(), timeout=5).started
        except AgentError:
            time.sleep(0.01)
    raise TimeoutError("no agent within 60 s")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=10)
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bootseer-bench-restart-"))
    cfg = config(base)
    client = AgentClient(base / "agent.sock")
    log = base / "agent.err"
    proc = start_agent(cfg, log)
    times: dict[str, list[float]] = {"in place": [], "stop and start": []}
    refused: dict[str, list[int]] = {k: [] for k in times}
    try:
        for _ in range(args.runs):
            for variant in times:
                before = wait_up(client)
                t0 = time.perf_counter()
                pinger = Pinger(client, before)
                if variant == "in place":
                    assert client.ask(AgentRestart(False)).state == "restarting"
                    pinger.start()
                else:
                    pinger.start()
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(timeout=30)
                    proc = start_agent(cfg, log)
                pinger.wait()
                assert pinger.answered_at is not None
                times[variant].append(pinger.answered_at - t0)
                refused[variant].append(pinger.unavailable)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        subprocess.run(["umount", "-l", str(base / "mnt")], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k in times:
        print(
            f"{k:15} median {med[k] * 1000:7.0f} ms to the new agent's answer "
            f"(min {min(times[k]) * 1000:.0f}, max {max(times[k]) * 1000:.0f}); "
            f"pings that found no agent: median {statistics.median(refused[k]):g}, "
            f"max {max(refused[k])}"
        )
    print(f"in place / stop and start: x{med['in place'] / med['stop and start']:.2f}")
    print(f"runs {args.runs} each, alternating; load {os.getloadavg()[0]:.1f} on {os.cpu_count()}")


if __name__ == "__main__":
    main()
