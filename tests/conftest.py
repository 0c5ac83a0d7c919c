"""Fixtures shared by all tests.

``cluster`` starts a real slurm-dev cluster (4 nodes) once per test session and stops
it at the end, even when tests fail. Its state dir and ports come from
``$BOOTSEER_TEST_STATE`` / ``$BOOTSEER_TEST_PORT_BASE`` so a developer's demo cluster
(default /var/tmp/bootseer-dev, port 17800) keeps running beside it.

Jobs are submitted as ordinary users (slurm-dev's ``alice``, ``bob``, ``mallory``), as on a
real cluster; root acts only where an admin would (scancel, scontrol, the site config).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from bootseer.store import Store, open_store

TOP = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TOP / "slurm-dev"))

import devcluster as devcluster  # noqa: E402 (the tests take it from here)


def _worker() -> int:
    """This process's number among pytest-xdist's workers (``gw1`` -> 1); 0 without xdist."""
    wid = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(wid[2:]) if wid.startswith("gw") and wid[2:].isdigit() else 0


# Each xdist worker has its own clusters: its own state dirs and, 500 ports further on, its
# own ports and node subnets (slurm-dev takes a subnet from the port base; tests use up to
# base + 150). Worker 0 keeps the defaults, so a run without xdist is unchanged.
WORKER_PORT_STEP = 500
TEST_STATE = Path(os.environ.get("BOOTSEER_TEST_STATE", "/var/tmp/bootseer-test"))
TEST_PORT_BASE = int(os.environ.get("BOOTSEER_TEST_PORT_BASE", "17900"))
if _worker():
    TEST_STATE = TEST_STATE.with_name(f"{TEST_STATE.name}-w{_worker()}")
    TEST_PORT_BASE += WORKER_PORT_STEP * _worker()


NOTICE = "bootseer on "  # how the plugin's line about a technique not set up begins


class DevSlurm:
    """A running slurm-dev cluster, as the tests use it."""

    def __init__(self, cluster: devcluster.Cluster) -> None:
        self.cluster = cluster
        self.dir = cluster.dir
        self.nodes = cluster.s.node_names
        self.env = {**os.environ, **cluster.env()}
        self.site_config = cluster.site_config
        self._default_config = self.site_config.read_text()

    def sbatch(self, *args: str, script: str = "#!/bin/sh\ntrue\n", user: str = "alice") -> int:
        """Submit a job as ``user``; returns its id. Raises CalledProcessError with sbatch's
        stderr."""
        out = self.dir / "out"
        out.mkdir(exist_ok=True)
        out.chmod(0o1777)  # every job user writes its output here
        r = subprocess.run(
            [*self.as_user(user), "sbatch", "--parsable", f"--output={out}/%j.out", *args],
            input=script,
            env=self.user_env(user),
            capture_output=True,
            text=True,
            cwd=self.dir,
        )
        if r.returncode != 0:
            raise subprocess.CalledProcessError(r.returncode, r.args, r.stdout, r.stderr)
        return int(r.stdout.strip().split(";")[0])

    def as_user(self, user: str) -> list[str]:
        """The command prefix that runs a program as ``user`` (nothing for root)."""
        return [] if user == "root" else devcluster.as_user(user)

    def user_env(self, user: str) -> dict[str, str]:
        return self.env if user == "root" else {**self.env, **devcluster.user_env(user)}

    def job_state(self, job_id: int) -> str:
        r = subprocess.run(
            ["scontrol", "-o", "show", "job", str(job_id)],
            env=self.env,
            capture_output=True,
            text=True,
        )
        for field in r.stdout.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return "UNKNOWN"

    def wait(self, job_id: int, timeout: float = 60) -> str:
        """Wait until the job has ended and every node's epilog is done; returns its state."""
        deadline = time.monotonic() + timeout
        final = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            r = subprocess.run(
                ["squeue", "-h", "-j", str(job_id), "-t", "all", "-o", "%T"],
                env=self.env,
                capture_output=True,
                text=True,
            )
            completing = "COMPLETING" in r.stdout
            if state in final and not completing:
                return state
            if state == "PENDING" and "held" in self.reason(job_id).lower():
                return "HELD"
            time.sleep(0.25)
        raise TimeoutError(f"job {job_id} still {self.job_state(job_id)} after {timeout}s")

    def reason(self, job_id: int) -> str:
        r = subprocess.run(
            ["squeue", "-h", "-j", str(job_id), "-o", "%r"],
            env=self.env,
            capture_output=True,
            text=True,
        )
        return r.stdout.strip()

    def output(self, job_id: int, notices: bool = False) -> str:
        """The job's output (stdout and stderr); without the lines bootseer's plugin said
        on stderr about techniques a node did not set up, unless ``notices``."""
        text = (self.dir / "out" / f"{job_id}.out").read_text()
        if notices:
            return text
        return "".join(x for x in text.splitlines(keepends=True) if not x.startswith(NOTICE))

    def notices(self, job_id: int) -> list[str]:
        """What the job was told on stderr, one line per node's step that missed a technique."""
        return [x for x in self.output(job_id, notices=True).splitlines() if x.startswith(NOTICE)]

    def report(self, *args: str, user: str = "root") -> subprocess.CompletedProcess[str]:
        """``bootseer report ARGS`` against this cluster's store, run as ``user``."""
        bootseer = Path(sys.executable).parent / "bootseer"
        return subprocess.run(
            [*self.as_user(user), str(bootseer), "report", *args],
            env=self.user_env(user),
            capture_output=True,
            text=True,
            timeout=120,
        )

    def report_json(self, job_id: int, user: str = "root") -> dict[str, Any]:
        r = self.report(str(job_id), "--json", user=user)
        assert r.returncode == 0, r.stderr
        data: dict[str, Any] = json.loads(r.stdout)
        return data

    def readable_by(self, user: str, files: list[Path]) -> list[Path]:
        """Those of ``files`` that ``user`` can read (``cat`` run as that user)."""
        return [
            f
            for f in files
            if subprocess.run(
                [*self.as_user(user), "cat", str(f)], capture_output=True, timeout=30
            ).returncode
            == 0
        ]

    def node_log(self, node: str) -> str:
        path = self.dir / "nodes" / node / "log" / f"{node}.log"
        return path.read_text() if path.exists() else ""

    def job_log_lines(self, node: str, job_id: int) -> list[str]:
        return [ln for ln in self.node_log(node).splitlines() if f" job={job_id} " in ln]

    def node_states(self) -> dict[str, str]:
        return self.cluster.node_states()

    def configure(self, section: str, **values: object) -> None:
        """Set keys of one site-config section (undone by the fixture after the test)."""
        data = tomllib.loads(self.site_config.read_text())
        data.setdefault(section, {}).update(values)
        self.site_config.write_text(to_toml(data))

    @contextmanager
    def ckpt_targets(self, name: str, count: int = 2, **ckpt: object) -> Iterator[list[str]]:
        """``count`` fresh file:// checkpoint targets in the cluster's state, named after
        the test, set as the site's ``[ckpt] targets`` with the other ``ckpt`` keys (the
        agents read the config afresh); removed afterwards."""
        roots = [self.dir / f"{name}-t{i}" for i in range(count)]
        for r in roots:
            shutil.rmtree(r, ignore_errors=True)
            r.mkdir()  # the site makes a store's root, never bootseer
        uris = [f"file://{r}" for r in roots]
        self.configure("ckpt", targets=uris, **ckpt)
        try:
            yield uris
        finally:
            for r in roots:
                shutil.rmtree(r, ignore_errors=True)

    def reset(self) -> None:
        self.site_config.write_text(self._default_config)
        states = self.node_states()
        bad = [n for n, s in states.items() if not s.startswith(("idle", "alloc", "mix"))]
        if bad:
            subprocess.run(
                ["scontrol", "update", f"NodeName={','.join(bad)}", "State=RESUME"],
                env=self.env,
                capture_output=True,
            )


def to_toml(data: dict[str, dict[str, object]]) -> str:
    """The little TOML the site config needs: tables of scalars, lists and inline tables."""

    def value(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        raise TypeError(f"cannot write {v!r} as TOML")

    out = []
    for name, table in data.items():
        out.append(f"[{name}]")
        out += [f"{k} = {value(v)}" for k, v in table.items()]
        out.append("")
    return "\n".join(out)


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    """Where :func:`store` keeps its objects (the deps tests put it where job users reach)."""
    return tmp_path / "store"


@pytest.fixture
def store(store_dir: Path) -> Store:
    """A file:// store of the test's own."""
    return open_store(f"file://{store_dir}")


@pytest.fixture(scope="session")
def _cluster_session() -> Iterator[DevSlurm]:
    if os.geteuid() != 0 or not shutil.which("slurmctld"):
        pytest.skip("the slurm-dev cluster needs root and Debian's Slurm (scripts/bootstrap)")
    settings = devcluster.Settings(str(TEST_STATE), nodes=4, port_base=TEST_PORT_BASE)
    with own_cluster(settings) as cluster:
        yield DevSlurm(cluster)


@contextmanager
def own_cluster(settings: devcluster.Settings) -> Iterator[devcluster.Cluster]:
    """A slurm-dev cluster started from an empty state dir (an earlier run's cluster there
    is stopped first) and stopped at the end, whatever happened."""
    state = Path(settings.state_dir)
    if state.exists():
        if (state / "cluster.json").exists():
            devcluster.Cluster.load(state).down()
        shutil.rmtree(state)
    cluster = devcluster.Cluster(settings)
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()


@pytest.fixture
def cluster(_cluster_session: DevSlurm) -> Iterator[DevSlurm]:
    """The session's cluster, with the default site config restored after each test."""
    yield _cluster_session
    _cluster_session.reset()


@pytest.fixture(scope="session")
def s3_store() -> Iterator[devcluster.Cluster]:
    """The S3 store host alone (SeaweedFS in its own network namespace, behind a link
    capped at 80 Mbit/s); ``.store_uri()`` names a bucket in it."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("the S3 store host needs root and iproute2")
    state = Path(str(TEST_STATE) + "-s3")
    shutil.rmtree(state, ignore_errors=True)
    store = devcluster.Cluster(
        devcluster.Settings(
            str(state), nodes=1, port_base=TEST_PORT_BASE + 50, s3=True, store_mbit=80
        )
    )
    store.write_config()
    try:
        store.store_host_up()
        yield store
    finally:
        store.store_host_down()


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory of its own under /tmp that job users may enter (with a ``log`` dir):
    pytest's tmp_path lies under /tmp/pytest-of-root, which any other pytest session of
    root's resets to 0700. A test module may define its own ``base``."""
    d = Path(tempfile.mkdtemp(prefix="bootseer-test-", dir="/tmp"))
    d.chmod(0o755)
    (d / "log").mkdir()
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def squash(src: Path, dest: Path) -> Path:
    """``mksquashfs`` of ``src`` into ``dest``, readable by every job user."""
    subprocess.run(
        ["mksquashfs", str(src), str(dest), "-noappend", "-quiet", "-no-progress"],
        check=True,
        capture_output=True,
    )
    dest.chmod(0o644)
    return dest


def random_image(cluster: DevSlurm, name: str, size: int) -> tuple[Path, Path]:
    """A squashfs ``<name>.sqsh`` under the cluster's images, of one file of ``size``
    random bytes (fresh blocks: no cache has them), and that file."""
    src = cluster.dir / f"{name}-src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir()
    (src / "blob").write_bytes(os.urandom(size))
    out = cluster.dir / "images" / f"{name}.sqsh"
    out.parent.mkdir(exist_ok=True)
    out.unlink(missing_ok=True)
    return squash(src, out), src / "blob"


@pytest.fixture
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A small real squashfs image, readable by every user (pytest's own temporary
    directories are root's alone)."""
    src = tmp_path_factory.mktemp("image-src")
    (src / "hello").write_text("hello from the image\n")
    readable = Path(tempfile.mkdtemp(prefix="bootseer-test-image-", dir="/var/tmp"))
    readable.chmod(0o755)
    try:
        yield squash(src, readable / "hello.sqsh")
    finally:
        shutil.rmtree(readable)


# What a test needs beyond this process is said by its markers (pyproject.toml), so that
# `-m "not slurm"` never starts the cluster: a test that asks for one of these fixtures
# without its marker is refused at collection.
FIXTURE_MARKERS = {"_cluster_session": "slurm", "s3_store": "s3"}


def unmarked(items: list[pytest.Item]) -> list[str]:
    """``nodeid: fixture without @marker`` for each test that uses a fixture of
    :data:`FIXTURE_MARKERS` (directly or through another fixture) without its marker."""
    return [
        f"{item.nodeid}: {fixture} without @pytest.mark.{marker}"
        for item in items
        for fixture, marker in FIXTURE_MARKERS.items()
        if fixture in getattr(item, "fixturenames", ()) and item.get_closest_marker(marker) is None
    ]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if bad := unmarked(items):
        raise pytest.UsageError("tests not marked for what they need:\n  " + "\n  ".join(bad))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``root`` or ``fuse`` is skipped, saying why, where it cannot run."""
    needs_root = item.get_closest_marker("root") or item.get_closest_marker("fuse")
    if needs_root and os.geteuid() != 0:
        pytest.skip("needs root")
    if item.get_closest_marker("fuse") and not os.path.exists("/dev/fuse"):
        pytest.skip("needs /dev/fuse")
