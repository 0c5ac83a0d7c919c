"""Fixtures for the deps tests: a world-traversable scratch dir, a file store, a step call."""

from __future__ import annotations

import io
import os
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer import mounts
from bootseer.config import SiteConfig
from bootseer.deps.frames import encode_stream
from bootseer.deps.layout import SnapshotPaths, new_data_name, ref_path
from bootseer.deps.manifest import Entry, Manifest
from bootseer.options import Mode, Options, parse_deps
from bootseer.sitekey import DEPS_MANIFEST, DEPS_REF, SiteKeys, seal_with
from bootseer.stepapi import StepCall
from bootseer.store import Store
from tests import hookkit
from tests.hookkit import job_context
from tests.sitekeys import KEYS, key_file

USER_A = 4242  # no account needed: numeric ids are enough for the kernel
USER_B = 4343


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("dropping to another user needs root")


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A scratch dir other users may enter (pytest's tmp_path is root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="bootseer-deps-test-", dir="/tmp"))
    os.chmod(d, 0o1777)
    try:
        yield d
    finally:
        # A job dir's deps/job is a tmpfs of its own (the prolog's, without its epilog
        # here): 448 were left mounted after one run of the suite.
        for mountpoint in mounts.mounts_under(d):
            mounts.umount(mountpoint, lazy=True)
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def store_dir(scratch: Path) -> Path:
    return scratch / "store"  # the one site() names


def _key(scratch: Path) -> Path:
    path = scratch / "site.key"
    return path if path.exists() else key_file(scratch)


def site(scratch: Path, **deps: object) -> SiteConfig:
    (scratch / "store").mkdir(parents=True, exist_ok=True)  # bootseer never makes its root
    return SiteConfig.from_mapping(
        {
            "site": {"key_file": str(_key(scratch))},
            "store": {"uri": f"file://{scratch}/store"},
            "paths": {
                "run_dir": f"{scratch}/run/%n",
                "cache_dir": f"{scratch}/cache/%n",
                "log_dir": f"{scratch}/log",
            },
            "deps": {"python": "/bin/false", **deps},
        }
    )


def fake_squeue(scratch: Path) -> Path:
    """A ``squeue`` that prints ``squeue.out`` (the jobs Slurm runs on the node: ``ID
    STATE`` lines; none while the file is missing)."""
    fake = scratch / "squeue"
    fake.write_text(f"#!/bin/sh\ncat {scratch}/squeue.out 2>/dev/null\nexit 0\n")
    fake.chmod(0o755)
    return fake


def step_call(
    scratch: Path,
    cfg: SiteConfig,
    *,
    job_id: int,
    uid: int,
    user: str,
    deps: str,
    node: str = "n1",
    nodes: tuple[str, ...] = ("n1",),
    mode: Mode = "on",
    work_dir: str = "",
) -> StepCall:
    ctx = job_context(
        Options(mode=mode, deps=parse_deps(deps)),
        job_id=job_id,
        user=user,
        uid=uid,
        node=node,
        nodes=nodes,
        work_dir=work_dir or str(scratch),
    )
    return hookkit.step_call(cfg, ctx, seconds=60)


def tar_bytes(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for ti, data in members:
            tf.addfile(ti, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def member(
    name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", link: str = "", mode: int = 0o644
) -> tuple[tarfile.TarInfo, bytes | None]:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.mode = mode
    ti.linkname = link
    if kind == tarfile.REGTYPE:
        ti.size = len(data)
        return ti, data
    return ti, None


def entries_of(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> list[Entry]:
    from bootseer.deps.archive import entry_of

    out = []
    for ti, _ in members:
        e = entry_of(ti)
        out.append(e if e is not None else Entry(ti.name, "f"))
    return out


def publish(
    store: Store,
    raw: bytes,
    entries: list[Entry],
    *,
    prefix: str,
    scope: str = "user/ada",
    base: str = "1" * 32,
    key: str = "2" * 32,
    frame_bytes: int = 1 << 16,
    keys: SiteKeys | None = KEYS,
) -> Manifest:
    """Put an arbitrary (possibly hostile) tar stream in the store as a snapshot, sealed
    with ``keys`` (as if the epilog had captured it; None: planted by a user)."""
    src = io.BytesIO(raw)
    out = io.BytesIO()
    frames = encode_stream(src.readinto, out.write, frame_bytes=frame_bytes, level=3, threads=2)
    name = new_data_name()
    paths = SnapshotPaths(scope, key)
    store.write_bytes(paths.data(name), out.getvalue())
    m = Manifest(
        key=key, base=base, scope=scope, prefix=prefix, data=name, frames=frames, entries=entries
    )
    store.write_bytes(paths.manifest, seal_with(keys, DEPS_MANIFEST, paths.manifest, m.to_json()))
    ref = ref_path(scope, base)
    store.write_bytes(ref, seal_with(keys, DEPS_REF, ref, b'{"key":"%s"}' % key.encode()))
    return m


TAR_FILTERS = ("native", "backport")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every deps test in this process runs once per tar filter (:func:`tar_filter`); one
    on the slurm-dev cluster runs once: its hooks extract in processes of their own, which
    the in-process switch does not reach (and a second run would find the first's snapshot)."""
    if "tar_filter" in metafunc.fixturenames and not metafunc.definition.get_closest_marker(
        "slurm"
    ):
        metafunc.parametrize("tar_filter", TAR_FILTERS, indirect=True)


@pytest.fixture(autouse=True)
def tar_filter(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every deps test runs with tarfile's own data filter (Python >= 3.11.4) and with
    bootseer's copy of its rules (what Debian bookworm's 3.11.2 runs); the extracting
    child is forked, so it sees the switch."""
    from bootseer.deps import datafilter

    param = getattr(request, "param", "native")
    if param == "native":
        if not datafilter.NATIVE:
            pytest.skip(f"Python {sys.version.split()[0]} has no tarfile data filter")
    else:
        monkeypatch.setattr(datafilter, "NATIVE", False)
    return str(param)


def fresh_deps(cluster_dir: Path, tag: str) -> tuple[Path, Path, str]:
    """A job's ``--bootseer-deps`` of its own on a slurm-dev cluster: a key file no other
    test names (so a snapshot of its own) and a fresh node-local prefix. Returns the key
    file's directory (the test's own), the prefix and the option."""
    import uuid

    from tests.conftest import devcluster

    work = cluster_dir / f"{tag}-{uuid.uuid4().hex[:8]}"
    work.mkdir(mode=0o755)
    (work / "req.txt").write_text(f"{tag}=={uuid.uuid4().hex}\n")
    (work / "req.txt").chmod(0o644)
    prefix = devcluster.NODE_LOCAL / f"{tag}-{os.urandom(4).hex()}"
    return work, prefix, f"--bootseer-deps={prefix},key={work}/req.txt"
