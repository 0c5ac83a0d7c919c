"""The checkpoint quota in real Slurm jobs of slurm-dev's users: alice's job saving past
her ``[ckpt] quota`` through its mount gets EDQUOT (the first file whole, the second
dropped), reads why in ``$BOOTSEER_CKPT/.bootseer.log``, sees her use with ``bootseer
ckpt usage``, frees room with ``bootseer ckpt rm`` and saves again; bob's job on another
node saves while alice's quota is full."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bootseer.ckpt.quota import user_bytes
from bootseer.store import open_store
from tests.conftest import DevSlurm

pytestmark = pytest.mark.slurm
UNIT = 1 << 20
QUOTA = 10 * UNIT

SAVE = f"""#!/bin/sh
/usr/bin/python3 - <<'PY'
import errno, os
d = os.environ["BOOTSEER_CKPT"]

def save(name, units):
    try:
        with open(f"{{d}}/{{name}}", "wb") as f:
            for _ in range(units):
                f.write(os.urandom({UNIT}))
        return "ok"
    except OSError as exc:
        return errno.errorcode[exc.errno]

print("first", save("a.pt", 6))
print("second", save("b.pt", 6))
print("listed", " ".join(sorted(os.listdir(d))))
PY
echo "log $(grep -c 'would pass the ckpt.quota of user' "$BOOTSEER_CKPT/.bootseer.log")"
bootseer ckpt usage
bootseer ckpt rm q:a.pt && echo removed
/usr/bin/python3 - <<'PY'
import os
with open(os.environ["BOOTSEER_CKPT"] + "/c.pt", "wb") as f:
    f.write(os.urandom(6 * {UNIT}))
print("third ok")
PY
"""


@pytest.fixture
def targets(cluster: DevSlurm) -> Iterator[list[str]]:
    # quota_rescan: counts at a mount's first write and before refusing only; a count
    # due mid-save may count an upload twice and refuse early (docs/ckpt.md).
    quota = {"user": QUOTA}
    with cluster.ckpt_targets("ckpt-q", unit_size=UNIT, quota=quota, quota_rescan=3600.0) as uris:
        yield uris


def test_alices_job_past_her_quota_gets_edquot_and_bobs_job_saves(
    cluster: DevSlurm, targets: list[str]
) -> None:
    n1, n2 = cluster.nodes[0], cluster.nodes[1]
    alice = cluster.sbatch("-N1", f"-w{n1}", "--bootseer-ckpt=q", script=SAVE)
    assert cluster.wait(alice) == "COMPLETED", cluster.output(alice)
    out = cluster.output(alice).splitlines()
    assert "first ok" in out and "second EDQUOT" in out, out
    assert "listed a.pt" in out, out  # b.pt was never published
    assert "log 1" in out, out
    row = next(line for line in out if line.startswith("user alice"))
    assert "10.0 MiB" in row, out  # the quota, and what she holds beside it
    assert "removed" in out and "third ok" in out, out

    stores = [open_store(t) for t in targets]
    held = user_bytes(stores, "alice")
    assert 6 * UNIT < held < 7 * UNIT  # c.pt alone: a.pt removed, b.pt dropped

    # alice's quota full to the byte; bob's job saves as if she held nothing.
    stores[0].write_bytes("alice/filler/x", bytes(QUOTA - held))
    bob = cluster.sbatch("-N1", f"-w{n2}", "--bootseer-ckpt=q", script=SAVE, user="bob")
    assert cluster.wait(bob) == "COMPLETED", cluster.output(bob)
    out = cluster.output(bob).splitlines()
    assert "first ok" in out and "second EDQUOT" in out and "third ok" in out, out
    assert user_bytes(stores, "alice") == QUOTA
