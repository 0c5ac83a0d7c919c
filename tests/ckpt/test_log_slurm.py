"""mallory's checkpoint mount, called in a loop: its daemon's log file on the node stays
bounded, and the job's user still reads the latest lines in ``.bootseer.log``."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from bootseer.ckptd.log import LOG_FILE_BYTES
from tests.conftest import DevSlurm

pytestmark = pytest.mark.slurm
PYTHON = f"{sys.executable}"
REFUSED = 20_000  # ~10 MB of log lines, more than twice the cap

# Each create of a name the mount refuses (a space) is an EINVAL and a log line.
FLOOD = f"""#!/bin/sh
set -e
{PYTHON} - <<'PY'
import errno, os
d = os.environ["BOOTSEER_CKPT"]
n = 0
for i in range({REFUSED}):
    try:
        os.close(os.open(f"{{d}}/bad name {{i:05d}} " + "x" * 180, os.O_CREAT | os.O_WRONLY))
    except OSError as exc:
        assert exc.errno == errno.EINVAL, exc
        n += 1
with open(os.path.join(d, "ok.bin"), "wb") as f:
    f.write(b"still saves")
last = open(os.path.join(d, ".bootseer.log")).read().splitlines()[-1]
print("refused", n, "last:", last)
PY
"""


@pytest.fixture
def targets(cluster: DevSlurm) -> Iterator[list[str]]:
    with cluster.ckpt_targets("ckpt-log", unit_size=1 << 20) as uris:
        yield uris


def test_a_loop_of_refused_calls_does_not_grow_the_mounts_log_without_bound(
    cluster: DevSlurm, targets: list[str]
) -> None:
    """20,000 refused creates (a line each, ~500 bytes) left a 10 MB log file of root's
    on the node's log disk; any loop of them grew it until the disk was full."""
    node = cluster.nodes[0]
    job = cluster.sbatch("-N1", f"-w{node}", "--bootseer-ckpt=flood", script=FLOOD, user="mallory")
    assert cluster.wait(job, timeout=300) == "COMPLETED", cluster.output(job)
    out = cluster.output(job)
    assert f"refused {REFUSED} last:" in out and "committed version" in out, out
    log = cluster.dir / "nodes" / node / "log" / "ckpt" / f"{job}.log"
    text = log.read_text()
    assert log.stat().st_size < LOG_FILE_BYTES + 4096, log.stat().st_size
    assert "this log file is at its cap" in text
    # Its last lines are still there, with how many were left out.
    assert "lines left out of this file past its cap" in text
    assert "unmounted;" in text.splitlines()[-1]
