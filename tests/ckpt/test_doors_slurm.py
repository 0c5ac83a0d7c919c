"""Root-run doors for what a job records or saves, on a real Slurm cluster with jobs as
ordinary users (issue 11): ``bootseer ckpt`` through the node agent, phase marks through
the node spool. alice saves and marks; bob tries to reach her namespaces and her rows
through every door; a user's login shell (outside any job) is told what it gets."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer.ckpt import Namespace
from bootseer.config import load_config
from bootseer.sitekey import site_keys
from tests.conftest import DevSlurm

pytestmark = pytest.mark.slurm
UNIT = 1 << 18
BOOTSEER = str(Path(sys.executable).parent / "bootseer")


@pytest.fixture
def targets(cluster: DevSlurm) -> Iterator[list[str]]:
    with cluster.ckpt_targets("door", unit_size=UNIT) as uris:
        yield uris


SAVE = """#!/bin/sh
set -e
f=$(mktemp)
/usr/bin/python3 -c "import os, sys; sys.stdout.buffer.write(os.urandom(700000))" > "$f"
echo "saved $(sha256sum < "$f" | cut -d' ' -f1)"
bootseer ckpt -q put "$f" door/proj:run1/model.bin
bootseer ckpt -q ls door/proj:run1
rm -f "$f"
"""

LOAD = """#!/bin/sh
set -e
echo "mount $(sha256sum < "$BOOTSEER_CKPT/run1/model.bin" | cut -d' ' -f1)"
echo "door $(bootseer ckpt -q get door/proj:run1/model.bin - | sha256sum | cut -d' ' -f1)"
"""


def _line(out: str, word: str) -> str:
    return next(ln.split()[1] for ln in out.splitlines() if ln.startswith(word + " "))


def test_a_jobs_bootseer_ckpt_saves_through_the_agent_and_the_next_job_mounts_it(
    cluster: DevSlurm, targets: list[str]
) -> None:
    """alice holds no store credentials: her job's `bootseer ckpt put` used to fail. The
    agent on n1 now saves it in alice/door/proj, sealed, so her next job's mount on n2
    serves it, and `ckpt get` there gives the same bytes."""
    n1, n2 = cluster.nodes[0], cluster.nodes[1]
    save = cluster.sbatch("-N1", f"-w{n1}", script=SAVE)
    assert cluster.wait(save) == "COMPLETED", cluster.output(save)
    out = cluster.output(save)
    assert "model.bin" in out, out
    cfg = load_config(cluster.site_config)
    m = Namespace.from_config(cfg, "alice/door/proj", keys=site_keys(cfg)).manifest(
        "run1/model.bin"
    )
    assert m is not None and m.size == 700000 and len(set(m.targets)) == 2
    load = cluster.sbatch("-N1", f"-w{n2}", "--bootseer-ckpt=door/proj", script=LOAD)
    assert cluster.wait(load) == "COMPLETED", cluster.output(load)
    got = cluster.output(load)
    assert _line(got, "mount") == _line(out, "saved") == _line(got, "door"), (out, got)


BOB = """#!/bin/sh
try() {
    err=$("$@" 2>&1 >/dev/null); rc=$?
    echo "TRY rc=$rc lines=$(printf '%s\\n' "$err" | grep -c .) :: $* :: $err"
}
d=$(mktemp -d)
try bootseer ckpt get ../alice/door/proj:run1/model.bin "$d/a"
try bootseer ckpt get /alice/door/proj:run1/model.bin "$d/b"
try bootseer ckpt get door/proj:../../alice/door/proj/files/run1/model.bin "$d/c"
try bootseer ckpt get door/proj:run1/model.bin "$d/d"
try bootseer ckpt get alice/door/proj:run1/model.bin "$d/e"
try bootseer ckpt ls ../alice/door/proj
try bootseer ckpt verify ../alice
try bootseer ckpt rm ../alice/door/proj:run1/model.bin
try bootseer ckpt --user alice ls door/proj
try bootseer ckpt gc door/proj
try /usr/bin/python3 -c "import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
q = {'op': 'ckpt_ls', 'ns': 'door/proj', 'path': 'run1', 'user': 'alice'}
s.sendall(json.dumps(q).encode() + b'\\n')
a = json.loads(s.makefile().readline())
sys.exit(1 if 'alice' in json.dumps(a) or a.get('entries') else 0)" "$AGENT"
echo "LEAKED $(cat "$d"/* 2>/dev/null | wc -c)"
"""


def test_bob_reaches_none_of_alices_checkpoints_through_the_agent(
    cluster: DevSlurm, targets: list[str]
) -> None:
    n1 = cluster.nodes[0]
    save = cluster.sbatch("-N1", f"-w{n1}", script=SAVE)
    assert cluster.wait(save) == "COMPLETED", cluster.output(save)
    agent = cluster.dir / "nodes" / n1 / "run" / "agent.sock"
    bob = cluster.sbatch("-N1", f"-w{n1}", f"--export=ALL,AGENT={agent}", script=BOB, user="bob")
    assert cluster.wait(bob) == "COMPLETED", cluster.output(bob)
    out = cluster.output(bob)
    tries = [ln for ln in out.splitlines() if ln.startswith("TRY ")]
    assert len(tries) == 11, out
    for t in tries[:-1]:
        assert "rc=1 lines=1 " in t and ":: bootseer ckpt: " in t, t
    assert tries[-1].startswith("TRY rc=0 "), tries[-1]  # the raw request saw nothing of hers
    assert "LEAKED 0" in out, out
    cfg = load_config(cluster.site_config)
    ns = Namespace.from_config(cfg, "alice/door/proj", keys=site_keys(cfg))
    assert ns.manifest("run1/model.bin") is not None  # bob's rm removed nothing


def test_outside_a_job_a_user_is_told_where_the_door_is(
    cluster: DevSlurm, targets: list[str]
) -> None:
    """A login shell is no node (slurm-dev's host runs no agent of its own): one line
    says why and where to run it. On a node's agent, outside any job, a user is refused
    by default (issue 21 item 4: ``[ckpt] door = "job"``; on main she made root write
    2 GiB of her sparse file to the targets in 16 s with no job at all); in a job she
    reaches her own namespaces (``test_bob_reaches_none_of_alices_...``)."""
    r = subprocess.run(
        [*cluster.as_user("alice"), BOOTSEER, "ckpt", "ls", "door/proj"],
        env={k: v for k, v in cluster.user_env("alice").items() if not k.startswith("SLURM")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert len(r.stderr.strip().splitlines()) == 1 and "no node agent" in r.stderr, r.stderr

    def bob_ls() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cluster.as_user("bob"), "env", f"SLURMD_NODENAME={cluster.nodes[0]}", *ckpt_ls()],
            env=cluster.user_env("bob"),
            capture_output=True,
            text=True,
            timeout=60,
        )

    # The agent keeps Slurm's list of the node's users for a few seconds (door.NODE_USERS):
    # a job of bob's that just ended (an earlier test's) may still count that long.
    deadline = time.monotonic() + 60
    while "has no job" not in (r := bob_ls()).stderr and time.monotonic() < deadline:
        time.sleep(0.5)
    # The node's agent answers (not "no node agent"), and refuses: he has no job there.
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"has no job on {cluster.nodes[0]}" in r.stderr, r.stderr


def ckpt_ls() -> list[str]:
    return [BOOTSEER, "ckpt", "ls", "door/proj"]


MARKER = """#!/bin/sh
set -e
srun -N2 -n2 bootseer phase start door_mark
srun -N2 -n2 bootseer phase end door_mark
echo marked
while [ ! -e "$FLAG" ]; do sleep 0.2; done
"""

FORGER = """#!/bin/sh
try() {
    err=$("$@" 2>&1 >/dev/null); rc=$?
    echo "TRY rc=$rc :: $* :: $err"
}
try sh -c "echo '{\\"ev\\":\\"end\\",\\"phase\\":\\"forged\\",\\"t\\":1}' >> $ALICE_MARKS"
try mkdir "$SPOOLS/99999999"
try ln -s /etc "$SPOOLS/99999998"
BOOTSEER_PHASE_MARKS=$ALICE_MARKS bootseer phase start forged
mine=$(echo "$BOOTSEER_PHASE_MARKS" | sed "s/%n/$SLURMD_NODENAME/g")
forged='"job_id":1,"user":"alice","node":"n9"'
echo "{\"ev\":\"start\",\"phase\":\"bobs\",\"t\":$(date +%s),$forged}" >> "$mine"
bootseer phase end bobs
echo forged
"""


def test_marks_land_for_their_own_job_only_from_any_node_and_nowhere_from_outside(
    cluster: DevSlurm, tmp_path: Path
) -> None:
    n1, n2 = cluster.nodes[0], cluster.nodes[1]
    flag = cluster.dir / "out" / f"door-flag-{tmp_path.name}"
    flag.unlink(missing_ok=True)
    alice = cluster.sbatch(
        "-N2", f"-w{n1},{n2}", "--bootseer", f"--export=ALL,FLAG={flag}", script=MARKER
    )
    spools = cluster.dir / "nodes" / n1 / "run" / "phases"
    marks = spools / str(alice) / "marks.jsonl"
    try:
        _wait_for(lambda: "marked" in _output(cluster, alice))
        bob = cluster.sbatch(
            "-N1",
            f"-w{n1}",
            "--bootseer",
            f"--export=ALL,ALICE_MARKS={marks},SPOOLS={spools}",
            script=FORGER,
            user="bob",
        )
        assert cluster.wait(bob) == "COMPLETED", cluster.output(bob)
    finally:
        flag.touch()
    assert cluster.wait(alice) == "COMPLETED", cluster.output(alice)
    out = cluster.output(bob)
    tries = [ln for ln in out.splitlines() if ln.startswith("TRY ")]
    assert len(tries) == 3 and all(not t.startswith("TRY rc=0 ") for t in tries), out
    assert "forged not recorded" in out, out  # the mark says why, and the script goes on
    assert "forged" in out.splitlines()[-1]

    a = cluster.report_json(alice)
    (run,) = a["runs"]
    assert run["user"] == "alice"
    by_node = {n["node"]: {p["phase"] for p in n["phases"]} for n in run["nodes"]}
    assert {n1, n2} <= set(by_node) and all("door_mark" in by_node[n] for n in (n1, n2))
    assert all("forged" not in phases for phases in by_node.values()), by_node
    b = cluster.report_json(bob)
    (brun,) = b["runs"]
    assert brun["user"] == "bob" and brun["job_id"] == bob
    assert any("bobs" in {p["phase"] for p in n["phases"]} for n in brun["nodes"]), brun

    # From a login shell, outside any job: nothing is recorded, the mark says so, and
    # the command does not fail (a script using marks runs anywhere).
    r = subprocess.run(
        [*cluster.as_user("alice"), BOOTSEER, "phase", "start", "door_mark"],
        env={k: v for k, v in cluster.user_env("alice").items() if not k.startswith("SLURM")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and "not recorded" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def _output(cluster: DevSlurm, job: int) -> str:
    try:
        return cluster.output(job)
    except FileNotFoundError:
        return ""


def _wait_for(cond: object, timeout: float = 90) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise TimeoutError("condition not met")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


FILLER = """#!/bin/sh
bootseer phase start fill
m=$(echo "$BOOTSEER_PHASE_MARKS" | sed "s/%n/$SLURMD_NODENAME/g")
if head -c 8388608 /dev/zero >> "$m" 2>/dev/null
then echo "FILLED all"
else echo "FILLED refused"
fi
echo "SIZE $(stat -c %s "$m")"
"""


def test_a_job_filling_its_marks_file_fills_only_its_own_spool(cluster: DevSlurm) -> None:
    """The marks file is the job user's to write: appending without end used to fill the
    node's run_dir (on a real node /run, a tmpfs slurmd, munge and every job share). The
    spool is now a tmpfs of its own, sized to the marks cap: the write stops there, the
    job and its epilog end normally, the node stays idle, and the next job marks again."""
    n1 = cluster.nodes[0]
    job = cluster.sbatch("-N1", f"-w{n1}", "--bootseer", script=FILLER)
    assert cluster.wait(job) == "COMPLETED", cluster.output(job)
    out = cluster.output(job)
    assert "FILLED refused" in out, out
    size = int(_line(out, "SIZE"))
    cap = load_config(cluster.site_config).phases.max_marks_bytes
    assert size <= cap + (1 << 20), out
    spool = cluster.dir / "nodes" / n1 / "run" / "phases" / str(job)
    assert not spool.exists()
    assert str(spool) not in Path("/proc/self/mountinfo").read_text()
    assert cluster.node_states()[n1].startswith("idle"), cluster.node_states()
    after = cluster.sbatch("-N1", f"-w{n1}", "--bootseer", script=MARK_ONE)
    assert cluster.wait(after) == "COMPLETED", cluster.output(after)
    (run,) = cluster.report_json(after)["runs"]
    assert any("one" in {p["phase"] for p in n["phases"]} for n in run["nodes"]), run


MARK_ONE = """#!/bin/sh
bootseer phase start one
bootseer phase end one
"""
