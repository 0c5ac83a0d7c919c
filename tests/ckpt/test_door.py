"""The checkpoint door (issue 11): a user's ``bootseer ckpt`` goes through the node agent,
which knows the caller by ``SO_PEERCRED`` and acts only in that user's namespaces.
A real agent and real users (slurm-dev's alice, bob, mallory), no Slurm; the same door
from inside Slurm jobs is in ``test_ckpt_slurm.py``."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from bootseer.agentapi.wire import MAX_LINE, encode
from bootseer.ckpt import Namespace
from bootseer.config import SiteConfig
from bootseer.sitekey import site_keys
from bootseer.units import iec
from tests.imagekit import AgentProc, site_config

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.skipif(
        os.geteuid() != 0 or not os.path.exists("/dev/fuse") or not shutil.which("setpriv"),
        reason="needs root, /dev/fuse and setpriv",
    ),
]

BOOTSEER = str(Path(sys.executable).parent / "bootseer")
UNIT = 1 << 16


def _users() -> None:
    for user in ("alice", "bob", "mallory"):
        try:
            pwd.getpwnam(user)
        except KeyError:
            pytest.skip(f"needs slurm-dev's user {user} (slurm-dev/up creates them)")


@pytest.fixture
def door(base: Path) -> Iterator[AgentProc]:
    """An agent whose site config has two file:// checkpoint targets."""
    _users()
    config = site_config(base, max_connections_per_user=4)
    for target in ("t1", "t2"):  # the site makes the targets' roots, never bootseer
        (base / target).mkdir()
    config["ckpt"] = {
        "targets": [f"file://{base}/t1", f"file://{base}/t2"],
        "unit_size": UNIT,
        "door": "any",
    }
    agent = AgentProc(base, "t1", config)
    try:
        yield agent.start()
    finally:
        agent.stop()


def home(base: Path, user: str) -> Path:
    """A directory of ``user``'s own, for the local side of put and get."""
    d = base / user
    d.mkdir(exist_ok=True, mode=0o700)
    pw = pwd.getpwnam(user)
    os.chown(d, pw.pw_uid, pw.pw_gid)
    return d


def as_user(user: str, agent: AgentProc, *argv: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """``bootseer ckpt ARGV`` run as ``user`` on the agent's node."""
    return subprocess.run(
        [
            "setpriv",
            f"--reuid={user}",
            f"--regid={user}",
            "--init-groups",
            *env(agent),
            BOOTSEER,
            "ckpt",
            "-q",
            *argv,
        ],
        **{"capture_output": True, "text": True, "timeout": 60, **kw},
    )


def env(agent: AgentProc) -> list[str]:
    return ["env", f"BOOTSEER_CONFIG={agent.config_path}", f"SLURMD_NODENAME={agent.node}"]


def namespace(agent: AgentProc, name: str) -> Namespace:
    """``name`` as root sees it, checking the site key's MACs."""
    cfg = SiteConfig.from_mapping(
        __import__("tomllib").loads(agent.config_path.read_text())
    ).for_node(agent.node)
    return Namespace.from_config(cfg, name, keys=site_keys(cfg))


def weights(base: Path, user: str, size: int = 3 * UNIT + 123) -> tuple[Path, bytes]:
    data = os.urandom(size)
    path = home(base, user) / "model.bin"
    path.write_bytes(data)
    pw = pwd.getpwnam(user)
    os.chown(path, pw.pw_uid, pw.pw_gid)
    return path, data


def test_a_user_puts_gets_lists_verifies_and_removes_through_the_agent(
    base: Path, door: AgentProc
) -> None:
    """alice has no store credentials: before the door her `ckpt put` failed. Now the
    agent writes into alice/proj, sealed, so a job's mount would serve it."""
    src, data = weights(base, "alice")
    r = as_user("alice", door, "put", str(src), "proj:step1/model.bin")
    assert r.returncode == 0, r.stderr
    m = namespace(door, "alice/proj").manifest("step1/model.bin")  # sealed, or this raises
    assert m is not None and m.size == len(data) and m.unit_count == 4
    out = home(base, "alice") / "back.bin"
    r = as_user("alice", door, "get", "proj:step1/model.bin", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == data and out.stat().st_uid == pwd.getpwnam("alice").pw_uid
    raw = as_user("alice", door, "get", "proj:step1/model.bin", "-", text=False)
    assert raw.returncode == 0 and cast(bytes, raw.stdout) == data
    r = as_user("alice", door, "ls", "proj:step1")
    assert r.returncode == 0 and "model.bin" in r.stdout and iec(len(data)) in r.stdout
    r = as_user("alice", door, "verify", "proj")
    assert r.returncode == 0 and "1 files" in r.stdout and "0 problems" in r.stdout, r.stdout
    # stdin through the door, too
    r = as_user("alice", door, "put", "-", "proj:step2/model.bin", input="from stdin")
    assert r.returncode == 0, r.stderr
    r = as_user("alice", door, "rm", "proj:step1/model.bin", "proj:step2/model.bin")
    assert r.returncode == 0, r.stderr
    assert namespace(door, "alice/proj").manifest("step1/model.bin") is None
    # The agent's log says what the door wrote, and for whom.
    uid = pwd.getpwnam("alice").pw_uid
    log = door.log_text()
    assert f"ckpt door: uid {uid} ckpt_put alice/proj: step1/model.bin" in log, log
    assert f"ckpt door: uid {uid} ckpt_rm alice/proj: step1/model.bin step2/model.bin" in log


def test_bob_cannot_reach_alices_namespaces_through_the_door(base: Path, door: AgentProc) -> None:
    src, data = weights(base, "alice")
    assert as_user("alice", door, "put", str(src), "proj:model.bin").returncode == 0
    bob = home(base, "bob")
    tries = [
        ["get", "proj:model.bin", str(bob / "a")],  # his own proj: empty
        ["get", "../alice/proj:model.bin", str(bob / "b")],
        ["get", "/alice/proj:model.bin", str(bob / "c")],
        ["get", "alice/proj:model.bin", str(bob / "d")],  # bob/alice/proj
        ["get", "proj:../../alice/proj/files/model.bin", str(bob / "e")],
        ["get", "proj:/alice/proj/files/model.bin", str(bob / "f")],
        ["ls", "../alice/proj"],
        ["ls", "proj:.."],
        ["verify", "../alice"],
        ["rm", "../alice/proj:model.bin"],
        ["rm", "alice/proj:model.bin"],
        ["put", str(src), "../alice/proj:model.bin"],  # bob cannot even read src
    ]
    for argv in tries:
        r = as_user("bob", door, *argv)
        assert r.returncode != 0, (argv, r.stdout)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("bootseer ckpt: "), (argv, r.stderr)
        assert "Traceback" not in r.stderr
    assert not [p for p in bob.iterdir() if p.stat().st_size]
    # bob's own namespace called "alice/proj" is bob/alice/proj, not alice's
    mine = bob / "mine.bin"
    mine.write_bytes(b"bob's")
    os.chown(mine, pwd.getpwnam("bob").pw_uid, pwd.getpwnam("bob").pw_gid)
    assert as_user("bob", door, "put", str(mine), "alice/proj:model.bin").returncode == 0
    m = namespace(door, "alice/proj").manifest("model.bin")
    assert m is not None and m.size == len(data)  # alice's file is unchanged
    b = namespace(door, "bob/alice/proj").manifest("model.bin")
    assert b is not None and b.size == len(b"bob's")
    # A raw request naming the user is answered for the caller alone.
    r = raw_as("bob", door, {"op": "ckpt_ls", "ns": "proj", "user": "alice"})
    assert r["ok"] and r["entries"] == [], r


def test_admin_actions_and_root_options_are_refused_in_one_line(
    base: Path, door: AgentProc
) -> None:
    for argv in (["gc", "proj"], ["--user", "alice", "ls", "proj"]):
        r = subprocess.run(
            [
                "setpriv",
                "--reuid=alice",
                "--regid=alice",
                "--init-groups",
                *env(door),
                BOOTSEER,
                "ckpt",
                *argv,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 1, (argv, r.stdout)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "root" in r.stderr, r.stderr


def raw_as(user: str, agent: AgentProc, doc: Any, fds: str = "", raw: bytes = b"") -> Any:
    """One raw request to the agent, sent by a process of ``user``; its decoded answer."""
    line = raw or encode(doc)
    code = RAW.replace("PATH", repr(str(agent.socket))).replace("LINE", repr(line))
    code = code.replace("FDS", fds or "[]")
    r = subprocess.run(
        [
            "setpriv",
            f"--reuid={user}",
            f"--regid={user}",
            "--init-groups",
            sys.executable,
            "-c",
            code,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


RAW = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(30)
s.connect(PATH)
fds = FDS
line = LINE
if fds:
    socket.send_fds(s, [line[:1]], fds)
    line = line[1:]
try:
    s.sendall(line)
except (BrokenPipeError, ConnectionResetError):
    pass  # the agent answered a request too long for it before reading it all
buf = b""
while not buf.endswith(b"\\n"):
    chunk = s.recv(1 << 16)
    if not chunk:
        break
    buf += chunk
sys.stdout.write(buf.decode())
"""


def test_huge_malformed_and_descriptor_abusing_requests_are_refused(
    base: Path, door: AgentProc
) -> None:
    r = raw_as("bob", door, None, raw=b'{"op":"ckpt_ls","ns":"' + b"a" * (MAX_LINE + 10) + b'"}\n')
    assert not r["ok"] and r["kind"] == "invalid", r
    r = raw_as("bob", door, {"op": "ckpt_ls", "ns": "a" * 5000})
    assert not r["ok"] and r["kind"] == "invalid", r
    r = raw_as("bob", door, {"op": "ckpt_rm", "ns": "p", "paths": ["x"] * 1001})
    assert not r["ok"] and r["kind"] == "invalid", r
    r = raw_as("bob", door, {"op": "ckpt_ls", "ns": ["p"]})
    assert not r["ok"] and r["kind"] == "invalid", r
    # put without a descriptor, with two, with one open for writing only
    r = raw_as("bob", door, {"op": "ckpt_put", "ns": "p", "path": "x"})
    assert not r["ok"] and "exactly one file descriptor" in r["error"], r
    two = "[os.open('/dev/null', os.O_RDONLY), os.open('/dev/null', os.O_RDONLY)]"
    r = raw_as("bob", door, {"op": "ckpt_put", "ns": "p", "path": "x"}, fds=two)
    assert not r["ok"] and r["kind"] == "invalid", r
    wronly = "[os.open('/dev/null', os.O_WRONLY)]"
    r = raw_as("bob", door, {"op": "ckpt_put", "ns": "p", "path": "x"}, fds=wronly)
    assert not r["ok"] and r["kind"] == "refused", r
    # get into a descriptor open for reading only: the agent writes nothing into it
    src, _data = weights(base, "bob")
    assert as_user("bob", door, "put", str(src), "p:x").returncode == 0
    target = home(base, "bob") / "readonly.bin"
    target.write_bytes(b"keep")
    os.chown(target, pwd.getpwnam("bob").pw_uid, pwd.getpwnam("bob").pw_gid)
    rdonly = f"[os.open({str(target)!r}, os.O_RDONLY)]"
    r = raw_as("bob", door, {"op": "ckpt_get", "ns": "p", "path": "x"}, fds=rdonly)
    assert not r["ok"] and r["kind"] == "refused", r
    assert target.read_bytes() == b"keep"
    # a directory descriptor
    r = raw_as(
        "bob",
        door,
        {"op": "ckpt_put", "ns": "p", "path": "y"},
        fds="[os.open('/tmp', os.O_RDONLY)]",
    )
    assert not r["ok"] and r["kind"] == "refused", r
    assert door.client.call("ping")["ok"]


# Opens COUNT puts and says how many were answered busy once EXPECT were (or, at the
# latest, after a deadline): the agent answers them as it gets to them, those past a
# user's share of transfers from its handler threads.
HOLD = """
import os, select, socket, sys, time
path, n = PATH, COUNT
held, pipes, refused = [], [], 0
for i in range(n):
    r, w = os.pipe()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    socket.send_fds(s, [b'{"op":"ckpt_put","ns":"p","path":"slow%d"}\\n' % i], [r])
    os.close(r)
    held.append(s)
    pipes.append(w)
expect, pending = EXPECT, list(held)
deadline = time.monotonic() + 30
while refused < expect and pending and time.monotonic() < deadline:
    ready, _, _ = select.select(pending, [], [], max(0.0, deadline - time.monotonic()))
    for s in ready:
        pending.remove(s)
        if b"busy" in s.recv(4096):
            refused += 1
print(refused, flush=True)
sys.stdin.read()
"""


def test_silent_puts_hold_only_their_users_share_and_end_with_the_caller(
    base: Path, door: AgentProc
) -> None:
    """mallory starts 20 puts from pipes she never writes: 4 connections (her cap) are
    served, and of those 2 transfers (her share) hold a thread; 18 are answered busy;
    alice still puts; when mallory's process dies, the agent's threads end and no
    version of hers is committed."""
    code = HOLD.replace("PATH", repr(str(door.socket))).replace("COUNT", "20")
    code = code.replace("EXPECT", "18")
    mallory = subprocess.Popen(
        [
            "setpriv",
            "--reuid=mallory",
            "--regid=mallory",
            "--init-groups",
            sys.executable,
            "-c",
            code,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert mallory.stdout is not None
        assert int(mallory.stdout.readline()) == 18
        src, _data = weights(base, "alice")
        r = as_user("alice", door, "put", str(src), "proj:model.bin")
        assert r.returncode == 0, r.stderr
    finally:
        mallory.kill()
        mallory.wait()
    # Her connections closed: the door notices and frees her share.
    answer: dict[str, Any] = {}
    for _ in range(100):
        answer = raw_as("mallory", door, {"op": "ckpt_ls", "ns": "p"})
        if answer.get("ok"):
            break
    assert answer.get("ok") and answer["entries"] == [], answer


def test_without_an_agent_the_user_is_told_in_one_line(base: Path, door: AgentProc) -> None:
    door.stop()
    r = as_user("alice", door, "ls", "proj")
    assert r.returncode == 1
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "no node agent" in r.stderr and "users hold no store credentials" in r.stderr


@pytest.fixture
def small_disk(base: Path) -> Iterator[Path]:
    """A 64 MiB ext4 that keeps half its blocks for root (as every ext4 keeps 5%), open
    to every user like a node's /tmp; unmounted at the end, whatever happened."""
    if not shutil.which("mkfs.ext4"):
        pytest.skip("needs e2fsprogs")
    img, mnt = base / "small.img", base / "small"
    with img.open("wb") as f:
        f.truncate(64 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "50", str(img)], check=True)
    mnt.mkdir()
    subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True)
    try:
        mnt.chmod(0o1777)
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
        img.unlink()


def test_a_get_takes_no_more_of_a_disk_than_its_user_may(
    base: Path, door: AgentProc, small_disk: Path
) -> None:
    """The agent (root) wrote a get into the user's own file: root's writes pass her
    quota and take the blocks a filesystem keeps for root. mallory filled a disk to her
    limit, then got 8 MiB of her checkpoint into it: before, it landed, out of root's
    reserve (a node's / filled for good). Now the agent writes into a pipe, her process
    writes the file and meets her limit; a descriptor of a file is refused."""
    src, data = weights(base, "mallory", size=8 << 20)
    assert as_user("mallory", door, "put", str(src), "p:big.bin").returncode == 0
    fill = subprocess.run(
        [
            "setpriv",
            "--reuid=mallory",
            "--regid=mallory",
            "--init-groups",
            "sh",
            "-c",
            f"head -c 64M /dev/zero > {small_disk}/fill",
        ],
        capture_output=True,
        text=True,
    )
    assert "No space left on device" in fill.stderr, fill.stderr
    free = os.statvfs(small_disk).f_bfree
    out = small_disk / "big.bin"
    r = as_user("mallory", door, "get", "p:big.bin", str(out))
    assert r.returncode != 0 and "No space left on device" in r.stderr, (r.returncode, r.stderr)
    assert sorted(p.name for p in small_disk.iterdir()) == ["fill", "lost+found"]
    assert os.statvfs(small_disk).f_bfree >= free  # root's reserve untouched
    # Her own client, passing the file itself: refused, nothing written.
    target = small_disk / "direct.bin"
    r = raw_as(
        "mallory",
        door,
        {"op": "ckpt_get", "ns": "p", "path": "big.bin"},
        fds=f"[os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT, 0o600)]",
    )
    assert not r["ok"] and r["kind"] == "refused" and "pipe" in r["error"], r
    assert target.stat().st_size == 0
    # Where there is room, a get still lands whole, as hers.
    (small_disk / "fill").unlink()
    r = as_user("mallory", door, "get", "p:big.bin", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == data and out.stat().st_uid == pwd.getpwnam("mallory").pw_uid


def test_a_verify_holds_one_of_its_users_transfers(base: Path, door: AgentProc) -> None:
    """A verify reads back every unit of what it checks, as a get does, but held no
    transfer: with her 2 transfers busy, mallory still had the agent read and hash her
    whole namespace, as many times at once as her connections allow (8 by default),
    as root and outside her job's allocation. Now it is busy like a third transfer,
    and served again once hers end."""
    src, _data = weights(base, "mallory")
    assert as_user("mallory", door, "put", str(src), "p:model.bin").returncode == 0
    # Two silent puts hold her share; a third answered busy says they do.
    code = HOLD.replace("PATH", repr(str(door.socket))).replace("COUNT", "3")
    code = code.replace("EXPECT", "1")
    argv = ["setpriv", "--reuid=mallory", "--regid=mallory", "--init-groups"]
    mallory = subprocess.Popen(
        [*argv, sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert mallory.stdout is not None
        assert int(mallory.stdout.readline()) == 1
        r = as_user("mallory", door, "verify", "p")
        assert r.returncode == 1 and "busy" in r.stderr, (r.returncode, r.stdout, r.stderr)
        # An ls reads up to 10,000 manifests: the same.
        r = as_user("mallory", door, "ls", "p")
        assert r.returncode == 1 and "busy" in r.stderr, (r.returncode, r.stdout, r.stderr)
    finally:
        mallory.kill()
        mallory.wait()
    answer: dict[str, Any] = {}
    for _ in range(100):
        answer = raw_as("mallory", door, {"op": "ckpt_verify", "ns": "p", "path": ""})
        if answer.get("ok"):
            break
    assert answer.get("ok") and answer["files"] == 1, answer
