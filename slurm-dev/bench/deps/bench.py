"""Dependency snapshots vs installing: pip, uv (cold cache), bootseer restore, tar floor.

One run, on the slurm-dev cluster's 4 nodes at once, against a real package index
(a PEP 503 tree served over HTTP from the store host, behind the same capped link
as the S3 store):

1. ``pip``: ``pip install --no-cache-dir -r req.txt`` into a fresh venv, per node.
2. ``uv``: ``uv pip install`` with an empty cache, per node.
3. capture: a ``--bootseer-deps`` job per node runs the install through
   ``bootseer deps run``; its epilog captures the snapshot (not timed).
4. ``restore``: the same jobs again, prefixes removed: the prolog restores from the
   S3 store (time from the hook log), ``bootseer deps run`` skips the install.
5. ``restore-local``: bootseer's restore of the same snapshot from local disk.
6. ``floor``: ``tar -I zstd -xf`` of the same archive from local disk.

The requirements include large binary wheels and one package built from its sdist
with the C compiler (markupsafe, served only as an sdist).

    slurm-dev/up --s3 --store-mbit 400   # first, with BOOTSEER_DEV_STATE / _PORT_BASE
    python slurm-dev/bench/deps/bench.py --smoke      # CI size, a few small packages
    python slurm-dev/bench/deps/bench.py              # the full size (run once)
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOP = HERE.parents[2]
sys.path.insert(0, str(TOP / "slurm-dev"))
sys.path.insert(0, str(TOP / "lib"))

import devcluster  # noqa: E402
from storehost import stop_http  # noqa: E402

SMOKE = ["six", "idna", "packaging", "attrs", "markupsafe"]
FULL = [
    "numpy",
    "scipy",
    "pandas",
    "matplotlib",
    "scikit-learn",
    "networkx",
    "sympy",
    "pillow",
    "requests",
    "jinja2",
    "markupsafe",
    "pyyaml",
    "rich",
    "click",
    "attrs",
    "tqdm",
    "fsspec",
    "filelock",
    "packaging",
    "psutil",
]
FROM_SOURCE = {"markupsafe"}  # served as an sdist only: built with the C compiler
BUILD_DEPS = ["setuptools", "wheel"]
INDEX_PORT = 8765  # weed uses 8080 in the store namespace
WORK = Path(os.environ.get("BOOTSEER_BENCH_DIR", "/var/tmp/bootseer-bench-deps"))


def sh(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)  # type: ignore[call-overload, no-any-return]


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def build_index(packages: list[str], root: Path) -> Path:
    """A PEP 503 tree of the packages and their dependencies (wheels; sdists for FROM_SOURCE)."""
    files = root / "files"
    if (root / "simple").exists():
        return root
    files.mkdir(parents=True)
    py = sys.executable
    binary = [p for p in packages if p not in FROM_SOURCE]
    sh(
        [
            py,
            "-m",
            "pip",
            "download",
            "-q",
            "-d",
            str(files),
            "--only-binary",
            ":all:",
            *binary,
            *BUILD_DEPS,
        ]
    )
    for p in FROM_SOURCE & set(packages):
        for f in files.glob(f"{p}-*"):
            f.unlink()
        for f in files.glob(f"{p.capitalize()}-*"):
            f.unlink()
        sh(
            [
                py,
                "-m",
                "pip",
                "download",
                "-q",
                "-d",
                str(files),
                "--no-binary",
                ":all:",
                "--no-deps",
                p,
            ]
        )
    by_name: dict[str, list[str]] = {}
    for f in sorted(os.listdir(files)):
        name = f.split("-")[0] if f.endswith(".whl") else f.rsplit("-", 1)[0]
        by_name.setdefault(norm(name), []).append(f)
    for name, fs in by_name.items():
        d = root / "simple" / name
        d.mkdir(parents=True)
        links = "".join(
            f'<a href="../../files/{html.escape(f)}">{html.escape(f)}</a>\n' for f in fs
        )
        (d / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    (root / "simple" / "index.html").write_text(
        "".join(f'<a href="{n}/">{n}</a>\n' for n in sorted(by_name))
    )
    return root


class Bench:
    def __init__(self, cluster: devcluster.Cluster, packages: list[str]) -> None:
        self.c = cluster
        self.env = {**os.environ, **cluster.env()}
        self.nodes = cluster.s.node_names
        self.packages = packages
        self.req = WORK / "req.txt"
        # The interpreter the jobs build their own environments on (`venv`/`uv venv --python`),
        # as a site's would be: the bare binary on purpose, so no job env is layered on
        # bootseer's venv, and its prefix is a deps link root. Nothing of bootseer runs on it
        # (the bench's own helpers run on sys.executable, the venv's).
        self.py = os.path.realpath(sys.executable)
        self.index_proc: subprocess.Popen[bytes] | None = None
        self.index_url = f"http://{cluster.s.store_ips[1]}:{INDEX_PORT}/simple"

    def start_index(self, root: Path) -> None:
        self.index_proc = self.c.serve_http(root, INDEX_PORT)

    def stop_index(self) -> None:
        stop_http(self.index_proc)
        self.index_proc = None

    def site_config(self) -> None:
        text = self.c.site_config.read_text()
        text = re.sub(r"\n\[deps\][^\[]*", "\n", text)
        roots = ["/usr", "/opt", str(Path(self.py).parents[1])]
        text += f"\n[deps]\nlink_roots = {json.dumps(roots)}\n[hooks.step_deadlines]\ndeps = 600\n"
        text = text.replace("prolog_deadline = 120", "prolog_deadline = 600")
        text = text.replace("epilog_deadline = 120", "epilog_deadline = 600")
        self.c.site_config.write_text(text)

    def run_jobs(self, name: str, script: str, deps: bool = False) -> dict[str, int]:
        """One single-node job per node, all at once; returns node -> job id."""
        out = WORK / "out"
        out.mkdir(exist_ok=True)
        ids = {}
        for node in self.nodes:
            args = [
                "sbatch",
                "--parsable",
                "-w",
                node,
                "-J",
                f"bench-{name}",
                f"--output={out}/%j.out",
                # PIP_CONFIG_FILE: the machine's pip.conf must not add indexes of its own.
                f"--export=ALL,BENCH_NODE={node},PIP_CONFIG_FILE=/dev/null",
            ]
            if deps:
                args.append(f"--bootseer-deps={WORK}/{node}/bs,key={self.req}")
            r = subprocess.run(
                args,
                input=script,
                env=self.env,
                text=True,
                capture_output=True,
                cwd=WORK,
                check=True,
            )
            ids[node] = int(r.stdout.strip().split(";")[0])
        deadline = time.monotonic() + 3600
        while time.monotonic() < deadline:
            r = subprocess.run(
                ["squeue", "-h", "-o", "%i", "-t", "PD,R,CG,CF,S"],
                env=self.env,
                text=True,
                capture_output=True,
            )
            live = set(r.stdout.split())
            if not live & {str(i) for i in ids.values()}:
                break
            time.sleep(1)
        time.sleep(2)  # epilogs
        return ids

    def timings(self, ids: dict[str, int], tag: str) -> dict[str, float]:
        got = {}
        for node, jid in ids.items():
            text = (WORK / "out" / f"{jid}.out").read_text()
            m = re.search(rf"^BENCH {tag} (\S+)$", text, re.M)
            if not m:
                raise RuntimeError(f"job {jid} on {node} printed no {tag} time:\n{text[-3000:]}")
            got[node] = float(m.group(1))
        return got

    def hook_secs(self, ids: dict[str, int], hook: str) -> tuple[dict[str, float], list[str]]:
        got, details = {}, []
        for node, jid in ids.items():
            log = (self.c.dir / "nodes" / node / "log" / f"{node}.log").read_text()
            m = re.search(
                rf"job={jid} {hook} step=deps outcome=(\w+) secs=([\d.]+) (.*)$", log, re.M
            )
            if not m:
                raise RuntimeError(f"no {hook} deps step for job {jid} on {node}")
            details.append(f"{node}: {m.group(1)} {m.group(3)}")
            got[node] = float(m.group(2))
        return got, details

    def clean(self, sub: str) -> None:
        for node in self.nodes:
            shutil.rmtree(WORK / node / sub, ignore_errors=True)
            (WORK / node).mkdir(parents=True, exist_ok=True)


def timed(tag: str, body: str) -> str:
    return (
        f"t0=$(date +%s.%N)\n{body}\nt1=$(date +%s.%N)\n"
        f'echo "BENCH {tag} $(python3 -c "print(round($t1 - $t0, 3))")"\n'
    )


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="a few small packages (CI)")
    ap.add_argument(
        "--state-dir", default=os.environ.get("BOOTSEER_DEV_STATE", "/var/tmp/bootseer-dev")
    )
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    cluster = devcluster.Cluster.load(Path(args.state_dir))
    if not cluster.s.s3:
        print("bench: the cluster needs the S3 store host: slurm-dev/up --s3", file=sys.stderr)
        return 2
    packages = SMOKE if args.smoke else FULL
    WORK.mkdir(parents=True, exist_ok=True)
    b = Bench(cluster, packages)
    b.req.write_text("\n".join(packages) + "\n")
    index = build_index(packages, WORK / ("index-smoke" if args.smoke else "index-full"))
    saved_config = cluster.site_config.read_text()
    py, url = b.py, b.index_url
    uv = shutil.which("uv", path=b.env["PATH"]) or "uv"
    pip_install = (
        f"{py} -m venv $P && $P/bin/pip install -q --no-cache-dir "
        f"--index-url {url} --trusted-host {cluster.s.store_ips[1]} -r {b.req}"
    )
    uv_install = (
        f"{uv} venv -q --python {py} $P && "
        f"UV_CACHE_DIR=$(mktemp -d) {uv} pip install -q --python $P/bin/python "
        f"--index-url {url} -r {b.req}"
    )
    results: dict[str, dict[str, float]] = {}
    try:
        b.site_config()
        b.start_index(index)
        b.clean("pip")
        ids = b.run_jobs(
            "pip",
            "#!/bin/sh\nset -e\nP=" + str(WORK) + "/$BENCH_NODE/pip\n" + timed("pip", pip_install),
        )
        results["pip"] = b.timings(ids, "pip")
        b.clean("uv")
        ids = b.run_jobs(
            "uv",
            "#!/bin/sh\nset -e\nP=" + str(WORK) + "/$BENCH_NODE/uv\n" + timed("uv", uv_install),
        )
        results["uv"] = b.timings(ids, "uv")

        from bootseer.store import open_store

        cluster.open_store().delete_prefix("deps")  # a cold start for the capture
        b.clean("bs")
        # BOOTSEER_* reach srun tasks, not the batch script itself: name the prefix here.
        wrapped = (
            f"#!/bin/sh\nset -e\nexport P={WORK}/$BENCH_NODE/bs\n"
            f"bootseer deps run -- sh -c '{uv_install}'\n"
        )
        ids = b.run_jobs("capture", wrapped, deps=True)
        cap, cap_details = b.hook_secs({b.nodes[0]: ids[b.nodes[0]]}, "epilog")
        for node in b.nodes:
            _, d = b.hook_secs({node: ids[node]}, "epilog")
            if "captured" not in d[0] and "already" not in d[0]:
                raise RuntimeError(f"no capture on {node}: {d[0]}")
        b.clean("bs")
        ids = b.run_jobs("restore", wrapped + "test -x $P/bin/python\n", deps=True)
        results["restore"], restore_details = b.hook_secs(ids, "prolog")
        if not all(" restored " in d for d in restore_details):
            raise RuntimeError("not every node restored:\n" + "\n".join(restore_details))
        for node, jid in ids.items():
            if "skipping the install" not in (WORK / "out" / f"{jid}.out").read_text():
                raise RuntimeError(f"job {jid} on {node} did not skip its install")

        store = cluster.open_store()
        shutil.rmtree(WORK / "local-store", ignore_errors=True)  # no earlier run's snapshots
        local = open_store(f"file://{WORK}/local-store")
        for o in store.list("deps", recursive=True):
            local.write_bytes(o.key, store.read_bytes(o.key))
        for o in local.list("deps", recursive=True):
            if o.key.endswith("manifest.json"):
                m = json.loads(local.read_bytes(o.key))
                node = Path(m["prefix"]).parent.name
                (WORK / f"{node}.data").write_text(o.key.rsplit("/", 1)[0] + "/" + m["data"])
                (WORK / f"{node}.key").write_text(f"{m['scope']} {m['key']}")
        b.clean("floor")
        ids = b.run_jobs(
            "floor",
            "#!/bin/sh\nset -e\nD=" + str(WORK) + "/$BENCH_NODE/floor\n"
            "mkdir -p $D\n"
            + timed(
                "floor",
                f'tar -I zstd -xf "{WORK}/local-store/$(cat {WORK}/$BENCH_NODE.data)" -C $D',
            ),
        )
        results["floor"] = b.timings(ids, "floor")
        roots = " ".join(["/usr", "/opt", str(Path(py).parents[1])])
        # bootseer's own venv runs it (b.py is the bare interpreter the installs start from).
        local_restore = (
            f"{sys.executable} {HERE / 'restore_local.py'} file://{WORK}/local-store "
            f"$(cat {WORK}/$BENCH_NODE.key) {roots}"
        )
        b.clean("bs")
        ids = b.run_jobs("local", "#!/bin/sh\nset -e\n" + local_restore + "\n")
        results["restore-local"] = b.timings(ids, "local")
    finally:
        b.stop_index()
        cluster.site_config.write_text(saved_config)
    report(results, packages, cap, cap_details, args.json)
    return 0


def report(
    results: dict[str, dict[str, float]],
    packages: list[str],
    cap: dict[str, float],
    cap_details: list[str],
    out: str | None,
) -> None:
    med = {k: statistics.median(v.values()) for k, v in results.items()}
    print(f"\ndeps bench: {len(packages)} requested packages on {len(results['pip'])} nodes")
    print(f"{'method':<15}{'median s':>10}{'min':>8}{'max':>8}{'spread':>9}   per node")
    for k, v in results.items():
        spread = (max(v.values()) - min(v.values())) / med[k] * 100 if med[k] else 0.0
        per = " ".join(f"{n}={s:.2f}" for n, s in sorted(v.items()))
        print(
            f"{k:<15}{med[k]:>10.2f}{min(v.values()):>8.2f}{max(v.values()):>8.2f}"
            f"{spread:>8.0f}%   {per}"
        )
    print(f"\npip / restore          {med['pip'] / med['restore']:6.1f}x   (target >= 10x)")
    print(f"uv / restore           {med['uv'] / med['restore']:6.1f}x   (target >= 3x)")
    print(f"restore-local / floor  {med['restore-local'] / med['floor']:6.2f}x   (target <= 1.5x)")
    print(f"capture (epilog, first node): {next(iter(cap.values())):.2f}s  {cap_details[0]}")
    if out:
        Path(out).write_text(
            json.dumps(
                {"results": results, "medians": med, "capture": cap, "packages": packages}, indent=1
            )
        )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
