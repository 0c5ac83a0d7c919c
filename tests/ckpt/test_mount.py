"""The FUSE mount, for real: the daemon, the job's user, another user, killed writers."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer import mounts
from bootseer.ckpt import Namespace
from bootseer.ckpt import mount as ckpt_mount
from bootseer.ckpt.names import namespace_name
from bootseer.config import SiteConfig
from bootseer.errors import StepError
from bootseer.hooks.steps import steps_for
from bootseer.options import Options
from bootseer.stepapi import StepCall
from tests.hookkit import job_context, step_call
from tests.waiting import wait_until

from .conftest import JOB_UID, OTHER_UID, UNIT, needs_fuse

pytestmark = needs_fuse
PY = "/usr/bin/python3"  # readable by every user, unlike a venv under /root
WRITE = "import sys; f = open(sys.argv[1], 'wb'); f.write(sys.stdin.buffer.read()); f.close()"


def as_user(
    uid: int, *cmd: str, data: bytes | None = None, check: bool = True
) -> subprocess.CompletedProcess[bytes]:
    done = subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *cmd],
        input=data,
        capture_output=True,
        check=False,
        timeout=60,
    )
    if check and done.returncode != 0:  # with what the command said (CalledProcessError hides it)
        raise AssertionError(
            f"{cmd} as uid {uid}: exit {done.returncode}: {done.stderr.decode(errors='replace')}"
        )
    return done


@pytest.mark.parametrize("size", [0, 1, UNIT - 1, UNIT, UNIT + 1, 3 * UNIT + 1, 10 * UNIT])
def test_round_trip_through_the_mount(
    mounted: tuple[Path, object], job_ns: Namespace, size: int
) -> None:
    mp, _ = mounted
    data = os.urandom(size)
    as_user(JOB_UID, PY, "-c", WRITE, f"{mp}/f.bin", data=data)
    assert as_user(JOB_UID, "cat", f"{mp}/f.bin").stdout == data
    with job_ns.open("f.bin") as f:
        assert f.read() == data
    assert os.stat(f"{mp}/f.bin").st_size == size


def test_api_and_mount_see_the_same_tree(mounted: tuple[Path, object], job_ns: Namespace) -> None:
    mp, _ = mounted
    data = os.urandom(2 * UNIT + 3)
    with job_ns.open("run/step1/model.pt", "wb") as f:
        f.write(data)
    assert as_user(JOB_UID, "cat", f"{mp}/run/step1/model.pt").stdout == data
    as_user(JOB_UID, "mkdir", "-p", f"{mp}/run/step2")
    as_user(JOB_UID, "cp", f"{mp}/run/step1/model.pt", f"{mp}/run/step2/tmp.pt")
    as_user(JOB_UID, "mv", f"{mp}/run/step2/tmp.pt", f"{mp}/run/step2/model.pt")
    with job_ns.open("run/step2/model.pt") as f:
        assert f.read() == data
    assert sorted(job_ns.walk()) == ["run/step1/model.pt", "run/step2/model.pt"]
    listing = as_user(JOB_UID, "ls", f"{mp}/run/step2").stdout.split()
    assert listing == [b"model.pt"]
    as_user(JOB_UID, "rm", f"{mp}/run/step1/model.pt")
    as_user(JOB_UID, "rmdir", f"{mp}/run/step1")
    assert [e.name for e in job_ns.listdir("run")] == ["step2"]


def test_mount_reads_ahead_in_big_requests(mounted: tuple[Path, object]) -> None:
    mp, _ = mounted
    dev = mounts.mount_device(mp)
    assert dev is not None
    assert Path(f"/sys/class/bdi/{dev}/read_ahead_kb").read_text().strip() == "4096"


def test_only_the_jobs_user_gets_in(mounted: tuple[Path, object], job_ns: Namespace) -> None:
    mp, _ = mounted
    with job_ns.open("secret.pt", "wb") as f:
        f.write(b"weights")
    st = os.stat(mp)
    assert (st.st_uid, st.st_mode & 0o777) == (JOB_UID, 0o700)
    assert os.stat(mp / "secret.pt").st_mode & 0o777 == 0o600
    for cmd in (("ls", str(mp)), ("cat", f"{mp}/secret.pt"), ("touch", f"{mp}/x")):
        res = as_user(OTHER_UID, *cmd, check=False)
        assert res.returncode != 0 and b"Permission denied" in res.stderr
    assert as_user(JOB_UID, "cat", f"{mp}/secret.pt").stdout == b"weights"


SLOW_WRITER = """
import sys, time
f = open(sys.argv[1], "wb")
f.write(b"n" * 5 * {unit})
print("writing", flush=True)
while True:
    f.write(b"n" * {unit})
    print("wrote", flush=True)
    time.sleep(0.01)  # a writer still busy when it is killed: the behaviour under test
"""


def test_killed_writer_leaves_previous_version(
    mounted: tuple[Path, ckpt_mount.MountRecord], job_ns: Namespace
) -> None:
    mp, rec = mounted
    old = os.urandom(3 * UNIT + 7)
    as_user(JOB_UID, PY, "-c", WRITE, f"{mp}/ckpt.pt", data=old)
    proc = subprocess.Popen(
        [
            "setpriv",
            f"--reuid={JOB_UID}",
            f"--regid={JOB_UID}",
            "--clear-groups",
            PY,
            "-c",
            SLOW_WRITER.format(unit=UNIT),
            f"{mp}/ckpt.pt",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"writing\n"
        # Killed in the middle of its stream: a few more units written after the first.
        assert [proc.stdout.readline() for _ in range(3)] == [b"wrote\n"] * 3
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # The kernel flushes and releases the dead writer's file; the daemon then drops it.
    wait_until(lambda: "new version dropped" in Path(rec.log).read_text(), "the drop")
    with job_ns.open("ckpt.pt") as f:
        assert f.read() == old
    assert as_user(JOB_UID, "cat", f"{mp}/ckpt.pt").stdout == old


FSYNC_WRITER = """
import os, sys
f = open(sys.argv[1], "wb")
f.write(b"a" * ({unit} + 5))
f.flush(); os.fsync(f.fileno())
print("synced", flush=True)
sys.stdin.readline()
f.write(b"b" * 10)
f.close()
"""


def test_fsync_commits_a_version(mounted: tuple[Path, object], job_ns: Namespace) -> None:
    mp, _ = mounted
    proc = subprocess.Popen(
        [
            "setpriv",
            f"--reuid={JOB_UID}",
            f"--regid={JOB_UID}",
            "--clear-groups",
            PY,
            "-c",
            FSYNC_WRITER.format(unit=UNIT),
            f"{mp}/f",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline() == b"synced\n"
        with job_ns.open("f") as f:
            assert f.read() == b"a" * (UNIT + 5)
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()
    with job_ns.open("f") as f:
        assert f.read() == b"a" * (UNIT + 5) + b"b" * 10


def test_bad_names_are_refused(mounted: tuple[Path, object], job_ns: Namespace) -> None:
    mp, _ = mounted
    res = as_user(JOB_UID, "touch", f"{mp}/a b", check=False)
    assert res.returncode != 0 and b"Invalid argument" in res.stderr
    res = as_user(JOB_UID, "touch", f"{mp}/.tmp-x", check=False)
    assert res.returncode != 0
    assert job_ns.listdir() == []


def test_concurrent_readers_through_the_mount(
    mounted: tuple[Path, object], job_ns: Namespace
) -> None:
    mp, _ = mounted
    data = os.urandom(20 * UNIT + 11)
    with job_ns.open("big", "wb") as f:
        f.write(data)
    procs = [
        subprocess.Popen(
            [
                "setpriv",
                f"--reuid={JOB_UID}",
                f"--regid={JOB_UID}",
                "--clear-groups",
                "cat",
                f"{mp}/big",
            ],
            stdout=subprocess.PIPE,
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert all(o == data for o in outs)


def test_dead_daemon_is_reported_and_cleaned_up(
    mounted: tuple[Path, ckpt_mount.MountRecord],
) -> None:
    mp, rec = mounted
    os.kill(rec.pid, signal.SIGKILL)
    wait_until(lambda: not ckpt_mount.daemon_alive(rec.pid, rec.mountpoint), "the kill")
    assert mounts.is_mounted(mp)
    res = ckpt_mount.stop(rec)
    assert res.died
    assert not mounts.is_mounted(mp) and not mp.exists()


def _call(tmp_path: Path, mount_root: Path, site_config: Path, ckpt: str) -> StepCall:
    import tomllib

    doc = tomllib.loads(site_config.read_text())
    doc["ckpt"]["mount_root"] = str(mount_root)
    doc["paths"].update(run_dir=str(tmp_path / "run"), log_dir=str(tmp_path / "log"))
    job = job_context(Options(mode="on", ckpt=ckpt), job_id=77, user="nobody", uid=JOB_UID)
    return step_call(SiteConfig.from_mapping(doc), job)


def test_prolog_mounts_and_epilog_unmounts(
    tmp_path: Path, mount_root: Path, site_config: Path, job_ns: Namespace
) -> None:
    from bootseer.ckpt import step

    call = _call(tmp_path, mount_root, site_config, "test")
    assert [s.name for s in steps_for("prolog", call.ctx)] == ["ckpt"]
    assert [s.name for s in steps_for("epilog", call.ctx)] == ["ckpt"]
    res = step.prolog(call)
    try:
        mp = Path(res.env["BOOTSEER_CKPT"])
        assert mp == mount_root / "77" and mounts.is_mounted(mp)
        as_user(JOB_UID, PY, "-c", WRITE, f"{mp}/m.pt", data=b"saved")
        with job_ns.open("m.pt") as f:
            assert f.read() == b"saved"
    finally:
        out = step.epilog(call)
    assert out.outcome == "ok" and "unmounted" in out.detail
    assert not mounts.is_mounted(mp) and not mp.exists()


def test_epilog_fails_the_step_when_the_daemon_died(
    tmp_path: Path, mount_root: Path, site_config: Path
) -> None:
    from bootseer.ckpt import step

    call = _call(tmp_path, mount_root, site_config, "test")
    step.prolog(call)
    rec = ckpt_mount.MountRecord.load(call.job.path / "ckpt")
    assert rec is not None
    os.kill(rec.pid, signal.SIGKILL)
    wait_until(lambda: not ckpt_mount.daemon_alive(rec.pid, rec.mountpoint), "the kill")
    with pytest.raises(StepError, match=r"daemon \(pid \d+\) died during the job"):
        step.epilog(call)
    assert not mounts.is_mounted(rec.mountpoint)


def test_prolog_reports_an_unreachable_target(
    tmp_path: Path, mount_root: Path, site_config: Path
) -> None:
    from bootseer.ckpt import step

    blocker = tmp_path / "blocker"
    blocker.write_text("")
    keep = site_config.read_text().split("[ckpt]")[0]  # the [site] key
    site_config.write_text(f'{keep}[ckpt]\ntargets = ["file://{blocker}/t"]\n')
    call = _call(tmp_path, mount_root, site_config, "test")
    with pytest.raises(StepError, match="is not reachable"):
        step.prolog(call)
    assert not mounts.is_mounted(mount_root / "77")
    # Nothing left for the epilog: no record, no mountpoint.
    assert step.epilog(call).outcome == "skipped"
    assert not (mount_root / "77").exists()


def test_namespace_is_the_users_own() -> None:
    assert namespace_name("nobody", "team/run") == "nobody/team/run"


def test_a_manifest_that_is_not_json_is_an_io_error_naming_the_file(
    mounted: tuple[Path, object], job_ns: Namespace
) -> None:
    """Not "no such file": a training script would then start from step 0."""
    mp, _ = mounted
    with job_ns.open("run/latest.pt", "wb") as f:
        f.write(os.urandom(UNIT + 5))
    job_ns.meta.write_bytes(job_ns.manifest_key("run/latest.pt"), b'{"format": 1, "size":')
    with pytest.raises(OSError) as api:
        job_ns.open("run/latest.pt")
    assert api.value.errno == errno.EIO
    # (written without the site key, it is refused before it is parsed)
    assert "nobody/test:run/latest.pt" in str(api.value) and "not sealed" in str(api.value)
    assert not isinstance(api.value, FileNotFoundError)
    for cmd in (["stat", f"{mp}/run/latest.pt"], ["cat", f"{mp}/run/latest.pt"]):
        r = as_user(JOB_UID, *cmd, check=False)
        assert r.returncode != 0
        assert b"Input/output error" in r.stderr, (cmd, r.stderr)
    r = as_user(JOB_UID, "ls", f"{mp}/run", check=False)
    assert b"Input/output error" in r.stderr or b"latest.pt" in r.stdout, r
    # Writing the file anew (the API) replaces the damaged manifest.
    with job_ns.open("run/latest.pt", "wb") as f:
        f.write(b"fresh")
    with job_ns.open("run/latest.pt") as f:
        assert f.read() == b"fresh"


def test_a_file_just_closed_can_be_renamed_or_rewritten_at_once(
    mounted: tuple[Path, object],
) -> None:
    """The kernel releases a closed file after close() returned: `cp a b && mv b c` and a
    rewrite right after a write used to meet EBUSY/ETXTBSY for a few milliseconds."""
    mp, _ = mounted
    as_user(JOB_UID, "mkdir", "-p", f"{mp}/again")
    script = (
        f"cd {mp}/again && for i in $(seq 1 20); do "
        "head -c 70000 /dev/urandom > tmp.bin && mv tmp.bin model.bin && "
        "echo $i > model.bin && echo $i > model.bin || exit 1; done"
    )
    r = as_user(JOB_UID, "sh", "-c", script, check=False)
    assert r.returncode == 0, r.stderr
    assert as_user(JOB_UID, "cat", f"{mp}/again/model.bin").stdout == b"20\n"


def test_the_epilog_has_what_the_mount_moved_from_the_daemons_totals(
    mounted: tuple[Path, ckpt_mount.MountRecord],
) -> None:
    mp, rec = mounted
    code = (
        "import sys, pathlib\n"
        "mp = pathlib.Path(sys.argv[1])\n"
        "(mp / 'a.pt').write_bytes(b'a' * 100)\n"
        "(mp / 'b.pt').write_bytes(b'b' * 1000)\n"
        "assert (mp / 'b.pt').read_bytes() == b'b' * 1000\n"
    )
    subprocess.run(
        [
            *("setpriv", f"--reuid={JOB_UID}", f"--regid={JOB_UID}", "--clear-groups"),
            *(sys.executable, "-c", code, str(mp)),
        ],
        check=True,
        cwd="/",
    )
    res = ckpt_mount.stop(rec)
    assert not res.died
    assert res.totals.committed == 2 and res.totals.dropped == 0
    assert res.totals.written_bytes == 1100
    # What the daemon served: the kernel may ask for a range again (its cache dropped).
    assert res.totals.read_bytes >= 1000 and res.totals.store_bytes >= 1000
    assert res.totals.peer_bytes == 0


def test_the_daemon_loads_pyarrow_without_numpy(
    site_config: Path, mount_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One daemon per job and node: pyarrow's NumPy would be half its import (issue 20).
    from tests.importtime import imported

    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")  # the daemon's stderr: its log
    mp = ckpt_mount.prepare_mountpoint(mount_root, "43", JOB_UID, JOB_UID)
    state = tmp_path / "state"
    state.mkdir()
    rec = ckpt_mount.start(mp, "nobody/test", JOB_UID, JOB_UID, state, node="", timeout=60)
    try:
        mods = imported(Path(rec.log).read_text())
    finally:
        ckpt_mount.stop(rec)
    assert "pyarrow.fs" in mods and "numpy" not in mods
