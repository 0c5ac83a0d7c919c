"""A peer serves only pieces of the job it proves it is of (issue 21 item 8).

On main, with any job's token a peer was served any ``deps/`` object range or any
checkpoint-target unit whose digest it knew. Here alice's two-node job runs on n1 and
n2; from n1 (an address of her job) a probe holding her job's real token (which only
root's agents derive; the test, as root, hands it over as the control) asks n2's peer
port for bob's checkpoint unit, bob's snapshot archive, and her own unit."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import tomllib

import pytest

from bootseer.config import SiteConfig
from bootseer.p2p.auth import job_token, load_site_key
from bootseer.store import open_store
from tests.conftest import DevSlurm, squash

pytestmark = pytest.mark.slurm


def _so_far(cluster: DevSlurm, job: int) -> str:
    try:
        return cluster.output(job)
    except FileNotFoundError:
        return ""


def test_a_peer_serves_only_pieces_of_the_job_it_proves(cluster: DevSlurm) -> None:
    work = cluster.dir / "p2p-scope"
    shutil.rmtree(work, ignore_errors=True)
    (work / "src").mkdir(parents=True)
    (work / "src" / "f").write_bytes(os.urandom(300_000))
    image = squash(work / "src", work / "img.sqsh")
    done = work / "done"
    with cluster.ckpt_targets("p2p-scope", count=1) as (target,):
        pieces = {
            "bobs-unit": (target, "bob/secret/units/v1/0"),
            "bobs-deps": ("", "deps/user/bob/k1/data-0123456789abcdef.tar.zst"),
            "own-unit": (target, "alice/own/units/v1/0"),
        }
        digests = {}
        for name, (uri, key) in pieces.items():
            data = os.urandom(4096)
            store = open_store(uri) if uri else cluster.cluster.open_store()
            store.write_bytes(key, data)
            digests[name] = hashlib.sha256(data).hexdigest()
        script = (
            "#!/bin/sh\nsrun -N2 sh -c 'echo up-$(hostname)'\n"
            f"i=0; while [ ! -e {done} ]; do i=$((i+1)); [ $i -gt 1200 ] && exit 1; "
            "sleep 0.1; done\n"
        )
        job = cluster.sbatch("-N2", "-w", "n1,n2", f"--bootseer-image={image}", script=script)
        try:
            deadline = time.monotonic() + 90
            while _so_far(cluster, job).count("up-") < 2:  # prepared on both nodes
                assert time.monotonic() < deadline, _so_far(cluster, job)
                time.sleep(0.2)
            cfg = SiteConfig.from_mapping(tomllib.loads(cluster.site_config.read_text()))
            token = job_token(load_site_key(cfg.p2p.key_file), job).hex()
            addr = cluster.cluster.s.network.node_ip("n2")
            asks = "\n".join(
                f'ask("{name}", "{uri}", "{key}", "{digests[name]}")'
                for name, (uri, key) in pieces.items()
            )
            probe = f"""#!/bin/sh
"$(dirname "$(command -v bootseer)")/python3" - <<'PY'
from bootseer.p2p.client import PeerClient
from bootseer.p2p.wire import PeerError, PieceRequest
def ask(name, target, key, digest):
    req = PieceRequest({job}, "", digest, 1, key=key, offset=0, length=4096, target=target)
    try:
        token = bytes.fromhex("{token}")
        data = PeerClient(timeout=30).fetch(("{addr}", {cfg.p2p.port}), req, token)
        print(name, "served", len(data))
    except PeerError as exc:
        print(name, "refused", exc.kind)
{asks}
PY
"""
            probe_job = cluster.sbatch("-N1", "-w", "n1", script=probe, user="mallory")
            assert cluster.wait(probe_job) == "COMPLETED", cluster.output(probe_job)
            lines = cluster.output(probe_job).splitlines()
        finally:
            done.touch()
        assert cluster.wait(job) == "COMPLETED", cluster.output(job)
    shutil.rmtree(work, ignore_errors=True)
    assert "bobs-unit refused missing" in lines, lines
    assert "bobs-deps refused missing" in lines, lines
    assert "own-unit served 4096" in lines, lines  # the control: address, token, piece right
