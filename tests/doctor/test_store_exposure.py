"""``bootseer doctor``'s store exposure check on a file:// store: users reach phases/
only (docs/security.md); a store written before private modes is flagged."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bootseer.doctor.store import check_store_exposure
from bootseer.store import open_store
from bootseer.store.exposure import exposure

from .test_doctor import make_node


def test_a_store_written_today_exposes_nothing(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        store = open_store(f"file://{tmp_path}/store")
        os.chmod(store.root, 0o755)
        store.write_bytes("deps/user/ada/k/manifest.json", b"x")
        store.write_bytes("images/blocks/ab/abcd", b"x")
        store.write_bytes("phases/day=2026-11-24/a.parquet", b"x")
    finally:
        os.umask(old)
    assert exposure(store) == []
    node = make_node(tmp_path, store={"uri": f"file://{tmp_path}/store"})
    check = check_store_exposure(node)
    assert check.status == "ok" and "other users reach phases/ only" in check.detail


@pytest.mark.parametrize(("top", "mode"), [("deps", 0o755), ("images", 0o711), ("", 0o777)])
def test_an_old_or_open_directory_is_a_problem(tmp_path: Path, top: str, mode: int) -> None:
    store = open_store(f"file://{tmp_path}/store")
    store.write_bytes("deps/user/ada/k/manifest.json", b"x")
    store.write_bytes("images/blocks/ab/abcd", b"x")
    os.chmod(os.path.join(store.root, top) if top else store.root, mode)
    found = exposure(store)
    assert len(found) == 1 and f"mode {mode:04o}" in found[0], found
    node = make_node(tmp_path, store={"uri": f"file://{tmp_path}/store"})
    check = check_store_exposure(node)
    assert check.status == "problem" and "chmod -R go-rwx" in check.fix


def test_a_site_may_keep_phase_records_private(base: Path) -> None:
    """[store] public_phases = false (Slurm's PrivateData=jobs): phase records are root's
    alone like everything else, and an old public phases/ is what the doctor flags."""
    import stat
    import subprocess

    from bootseer.config import SiteConfig
    from bootseer.phases.schema import JobMeta
    from bootseer.phases.writer import write_rows

    uri = f"file://{base}/store"
    cfg = SiteConfig.from_mapping({"store": {"uri": uri, "public_phases": False}})
    (base / "store").mkdir(exist_ok=True)  # a store's root is the site's to make
    store = cfg.store.open()
    os.chmod(store.root, 0o755)
    key = write_rows(store, [JobMeta(job_id=7, node="n1").row("prolog", 1e9, 1e9 + 2)], "prolog")
    assert key is not None
    path = Path(store.root) / key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((Path(store.root) / "phases").stat().st_mode) == 0o700
    if os.geteuid() == 0:
        r = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat", str(path)],
            capture_output=True,
        )
        assert r.returncode != 0
    assert exposure(store) == []
    os.chmod(Path(store.root) / "phases", 0o755)  # written by a site that had them public
    assert exposure(store) == [f"{store.root}/phases is open to every user (mode 0755)"]
    public = SiteConfig.from_mapping({"store": {"uri": uri}}).store.open()
    assert exposure(public) == []  # public by default


@pytest.mark.root
def test_a_user_reading_private_phase_records_is_told_why(base: Path) -> None:
    """`bootseer report`'s read of a private phases/ fails saying the site keeps them
    private and who may read them."""
    import subprocess
    import sys

    if os.geteuid() != 0:
        pytest.skip("needs root to run as another user")
    from bootseer.config import SiteConfig
    from bootseer.phases.schema import JobMeta
    from bootseer.phases.writer import write_rows

    cfg = SiteConfig.from_mapping({"store": {"uri": f"file://{base}/store"}})
    (base / "store").mkdir(exist_ok=True)  # a store's root is the site's to make
    store = cfg.store.open()
    os.chmod(store.root, 0o755)
    write_rows(store, [JobMeta(job_id=7, node="n1").row("prolog", 1e9, 1e9 + 2)], "prolog")
    os.chmod(Path(store.root) / "phases", 0o700)
    lib = Path(__file__).resolve().parents[2] / "lib"
    code = f"""
import sys
sys.path.insert(0, {str(lib)!r})
from bootseer.config import SiteConfig
from bootseer.phases.reader import PhaseDataset
cfg = SiteConfig.from_mapping({{"store": {{"uri": "file://{base}/store",
                                           "public_phases": False}}}})
PhaseDataset(cfg.store.open()).job(7)
"""
    r = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable],
        input=code,
        capture_output=True,
        text=True,
        cwd="/",
    )
    assert r.returncode != 0
    assert "keeps phase records private" in r.stderr and "as root" in r.stderr, r.stderr


def test_a_listening_grpc_port_beside_the_gateway_is_a_side_door() -> None:
    """Issue 21.1: the probe connects to the gateway's port + 10000 (SeaweedFS's gRPC,
    PutIdentity) and names it when it accepts; a closed one is no door."""
    import socket

    from bootseer.store.sidedoors import side_doors

    listener = socket.create_server(("127.0.0.1", 0))
    try:
        grpc = listener.getsockname()[1]
        uri = f"s3://b/p?endpoint_override=127.0.0.1:{grpc - 10000}&scheme=http"
        doors = side_doors(uri)
        assert [d.port for d in doors if d.port == grpc] == [grpc], doors
        assert "S3 gateway gRPC" in str(doors[[d.port for d in doors].index(grpc)])
    finally:
        listener.close()
    assert grpc not in [d.port for d in side_doors(uri)]
    assert side_doors("file:///tmp/store") == []
