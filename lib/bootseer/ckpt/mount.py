"""Start and stop a job's checkpoint mount: a FUSE daemon that outlives the prolog.

The prolog calls :func:`start`: it makes the mountpoint ``<mount_root>/<job_id>``
(owned by the job's user, mode 0700), starts ``python -m bootseer.ckptd`` in a
session of its own, waits until the kernel lists the mount, and keeps the daemon's
pid in the job dir. What names the user's data (the namespace, the uid, the job and its
nodes: :class:`Identity`) reaches the daemon in a memfd it inherits, never on its
command line, which ``ps`` shows every user of the node. The epilog calls :func:`stop`
with that record: it unmounts (lazily if the job left processes inside), waits for the
daemon, escalates to signals if it must, and says whether the daemon had died during
the job.

    >>> m = start(mountpoint, "ada/llama", uid=1000, gid=1000, state_dir=job_dir / "ckpt",
    ...           node="n1", timeout=20)                      # doctest: +SKIP
    >>> stop(m).died                                         # doctest: +SKIP
    False
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import stat
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bootseer import localrecord
from bootseer.ckpt.totals import MountTotals, totals_path
from bootseer.errors import StepError
from bootseer.mounts import is_mounted, set_read_ahead, umount

DAEMON_MODULE = "bootseer.ckptd"
# What earlier versions started the daemon as: a job mounted before an upgrade of the
# node is still its daemon's when the new epilog stops it.
EARLIER_DAEMON_MODULES = ("bootseer.ckpt.fuse",)


MAX_IDENTITY = 1 << 20  # bytes of an identity (a job's node list fits many times over)


@dataclass(frozen=True)
class Identity:
    """Whose data a mount daemon serves: passed in an inherited descriptor, not argv."""

    namespace: str  # <user>/<name>
    uid: int
    gid: int
    job_id: int = 0
    nodes: tuple[str, ...] = ()
    account: str = ""  # the job's Slurm account (peers: which snapshots are the job's)

    def to_fd(self) -> int:
        """A memfd holding this identity, positioned at its start (inheritable)."""
        fd = os.memfd_create("bootseer-ckpt-identity", 0)
        data = json.dumps(asdict(self)).encode()
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
        return fd

    @classmethod
    def from_fd(cls, fd: int) -> Identity:
        """The identity in ``fd`` (closed after); :class:`StepError` if it is not one."""
        try:
            data = os.read(fd, MAX_IDENTITY + 1)
        finally:
            os.close(fd)
        try:
            if len(data) > MAX_IDENTITY:
                raise ValueError(f"more than {MAX_IDENTITY} bytes")
            raw = json.loads(data)
            if not isinstance(raw, dict):
                raise ValueError("not a JSON object")
            return cls(
                str(raw["namespace"]),
                int(raw["uid"]),
                int(raw["gid"]),
                int(raw.get("job_id", 0)),
                tuple(str(n) for n in raw.get("nodes", ())),
                str(raw.get("account", "")),
            )
        except (TypeError, KeyError, ValueError) as exc:
            raise StepError(f"the mount daemon's identity (fd {fd}) is not one: {exc}") from None


@dataclass(frozen=True)
class MountRecord:
    pid: int
    mountpoint: str
    namespace: str
    log: str  # the daemon's stderr

    def save(self, state_dir: Path) -> None:
        localrecord.write(state_dir / "mount.json", self)

    @classmethod
    def load(cls, state_dir: Path) -> MountRecord | None:
        """The record, or None where there is none, or none that is one."""
        try:
            return localrecord.read(cls, state_dir / "mount.json")
        except (OSError, localrecord.RecordError):
            return None


@dataclass(frozen=True)
class StopResult:
    died: bool  # the daemon was gone before the epilog came
    forced: bool  # it had to be signalled (or the unmount was lazy)
    log_tail: str
    totals: MountTotals  # what the daemon left at exit (zeros when it died)


def daemon_alive(pid: int, mountpoint: str) -> bool:
    """Whether ``pid`` is our mount daemon for ``mountpoint`` (not a reused pid, not a zombie)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    if state[state.rfind(b")") + 2 :][:1] in (b"Z", b"X"):
        return False
    modules = (DAEMON_MODULE, *EARLIER_DAEMON_MODULES)
    return any(m.encode() in cmdline for m in modules) and os.fsencode(mountpoint) in cmdline


def log_tail(path: str | Path, lines: int = 8) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no daemon log)"
    return " | ".join(text.strip().splitlines()[-lines:]) or "(daemon log empty)"


def prepare_mountpoint(root: Path, name: str, uid: int, gid: int) -> Path:
    """``root/name``: a fresh directory of the job's user, mode 0700, nothing mounted on it."""
    root.mkdir(parents=True, exist_ok=True, mode=0o755)
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise StepError(f"mount root {root} must be a directory of root's that only root may write")
    mp = root / name
    if is_mounted(mp):
        # Left by an earlier run of this job id on this node (a requeue after a crash).
        with contextlib.suppress(OSError):
            umount(mp, lazy=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(mp, 0o700)
    st = os.lstat(mp)
    if not stat.S_ISDIR(st.st_mode):
        raise StepError(f"mountpoint {mp} exists and is not a directory")
    os.chown(mp, uid, gid, follow_symlinks=False)
    os.chmod(mp, 0o700)
    return mp


def start(
    mountpoint: Path,
    namespace: str,
    uid: int,
    gid: int,
    state_dir: Path,
    node: str,
    timeout: float,
    log_path: Path | None = None,
    read_ahead_kb: int = 4096,
    job_id: int = 0,
    nodes: tuple[str, ...] = (),
    account: str = "",
) -> MountRecord:
    """Start the daemon and wait for the mount; on failure nothing is left running."""
    log_path = log_path or state_dir / "fuse.log"
    log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    ident = Identity(namespace, uid, gid, job_id, tuple(nodes), account).to_fd()
    cmd = [
        sys.executable,
        "-m",
        DAEMON_MODULE,
        "--identity-fd",
        str(ident),
        "--node",
        node,
        "--totals",
        str(totals_path(log_path)),
        str(mountpoint),
    ]
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        with open(fd, "ab") as logf:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                cwd="/",
                close_fds=True,
                pass_fds=(ident,),
                start_new_session=True,
            )
    finally:
        os.close(ident)
    record = MountRecord(proc.pid, str(mountpoint), namespace, str(log_path))
    record.save(state_dir)
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        if is_mounted(mountpoint):
            # The first request waits for the daemon's INIT reply, which sets the
            # read-ahead too: only after it does our setting stick.
            os.stat(mountpoint)
            set_read_ahead(mountpoint, read_ahead_kb)
            return record
        if proc.poll() is not None:
            _forget(state_dir, mountpoint)
            raise StepError(
                f"checkpoint mount daemon for {namespace} exited with status "
                f"{proc.returncode} before mounting: {log_tail(log_path)}"
            )
        time.sleep(0.05)
    _kill(proc.pid, mountpoint)
    with contextlib.suppress(ChildProcessError, OSError, subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    if not is_mounted(mountpoint):
        _forget(state_dir, mountpoint)
    raise StepError(
        f"checkpoint mount of {namespace} at {mountpoint} not up within {timeout:g}s: "
        f"{log_tail(log_path)}"
    )


def _forget(state_dir: Path, mountpoint: Path) -> None:
    """A mount that never came up: nothing for the epilog to report or clean."""
    with contextlib.suppress(OSError):
        (state_dir / "mount.json").unlink()
    with contextlib.suppress(OSError):
        os.rmdir(mountpoint)


def _kill(pid: int, mountpoint: str | Path, grace: float = 5.0) -> bool:
    """SIGTERM, then SIGKILL after ``grace`` seconds; True if a signal was needed."""
    if not daemon_alive(pid, str(mountpoint)):
        return False
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        t_end = time.monotonic() + grace
        while time.monotonic() < t_end:
            if not daemon_alive(pid, str(mountpoint)):
                return True
            time.sleep(0.05)
    return True


def stop(record: MountRecord, wait: float = 15.0) -> StopResult:
    """Unmount and stop the daemon; ``died`` tells whether it had died on its own."""
    mp = record.mountpoint
    died = not daemon_alive(record.pid, mp)
    tail = log_tail(record.log) if died else ""
    forced = False
    if is_mounted(mp):
        try:
            umount(mp)
        except OSError as exc:
            if exc.errno not in (errno.EBUSY, errno.ENOTCONN, errno.EINVAL):
                raise
            # Processes of the job still inside (or a dead daemon): detach now, the
            # kernel finishes when the last user lets go.
            umount(mp, lazy=True)
            forced = True
    # The daemon leaves by itself once unmounted (aborting writes never closed).
    t_end = time.monotonic() + wait
    while time.monotonic() < t_end and daemon_alive(record.pid, mp):
        time.sleep(0.05)
    forced = _kill(record.pid, mp) or forced
    if not is_mounted(mp):
        with contextlib.suppress(OSError):
            os.rmdir(mp)  # never rmtree: a mount that came back would be emptied
    return StopResult(
        died, forced, tail, MountTotals.read(totals_path(record.log)) or MountTotals()
    )
