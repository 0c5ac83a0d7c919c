"""The snapshot key: everything that makes one install differ from another.

A key has two levels. The *base* covers what the prolog can know before the job
runs: the contents of the declared key files, the prefix, the container image, the
node (CPU architecture, OS release, Python version and ABI, GPU model and driver)
and the scope. The *snapshot key* adds the install command, which only the job's
``bootseer deps run`` knows; the store keeps a ref from each base to the snapshot
key of its latest capture, so the prolog can restore before the job has said
which command it runs.

    >>> inputs = KeyInputs(scope="user/ada", prefix="/tmp/venv",
    ...                    key_files=(("requirements.txt", "ab" * 32),), image="",
    ...                    arch="x86_64", os_release="debian 12", python="cp311", gpu="none")
    >>> len(inputs.base()), len(snapshot_key(inputs.base(), ["pip", "install", "-r", "r.txt"]))
    (32, 32)
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import platform
import re
import stat
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bootseer.errors import StepError
from bootseer.options import Scope

_SCOPE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
KEY_LEN = 32  # hex digits of sha256 kept: 128 bits


class KeyInputError(StepError):
    """A key input could not be read (a key file is missing or not the user's to read)."""


@dataclass(frozen=True)
class KeyInputs:
    scope: str  # "user/NAME", "account/NAME" or "cluster"
    prefix: str
    key_files: tuple[tuple[str, str], ...]  # (name as the job gave it, sha256 of contents)
    image: str  # "" without a container image
    arch: str
    os_release: str
    python: str
    gpu: str

    def base(self) -> str:
        return _digest(asdict(self))

    def describe(self) -> dict[str, object]:
        d = asdict(self)
        d["key_files"] = {name: digest for name, digest in self.key_files}
        return d


def snapshot_key(base: str, command: Sequence[str] | None) -> str:
    """The key of one snapshot: the base plus the install command (``None``: none given)."""
    return _digest({"base": base, "command": list(command) if command is not None else None})


def _digest(obj: Any) -> str:
    canon = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canon).hexdigest()[:KEY_LEN]


def scope_dir(scope: Scope, user: str, account: str) -> str:
    """The store directory of a scope, decided by who runs the job, never by the job."""
    if scope == "user":
        name = user
    elif scope == "account":
        name = account
    elif scope == "cluster":
        return "cluster"
    else:
        raise StepError(f"unknown snapshot scope {scope!r}")
    if not _SCOPE_NAME.match(name or ""):
        raise StepError(f"scope={scope}: {name!r} is not a usable {scope} name")
    return f"{scope}/{name}"


def hash_key_files(files: Sequence[str], work_dir: str, max_bytes: int) -> list[tuple[str, str]]:
    """sha256 of each key file, with the rights of the calling process.

    The prolog calls this in a child that has dropped to the job's user
    (:mod:`bootseer.asuser`): a file the user cannot read is an error that says
    so and nothing more.
    """
    out = []
    for name in files:
        path = name if name.startswith("/") else os.path.join(work_dir or ".", name)
        if not name.startswith("/") and not work_dir:
            raise KeyInputError(
                f"key file {name!r} is relative but the job has no working directory"
            )
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise KeyInputError(f"key file {name}: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise KeyInputError(f"key file {name}: not a regular file")
            if st.st_size > max_bytes:
                raise KeyInputError(f"key file {name}: larger than {max_bytes} bytes")
            h = hashlib.sha256()
            while chunk := os.read(fd, 1 << 20):
                h.update(chunk)
        finally:
            os.close(fd)
        out.append((name, h.hexdigest()))
    return out


def hash_key_files_as(
    uid: int,
    gid: int,
    groups: Sequence[int],
    files: Sequence[str],
    work_dir: str,
    max_bytes: int,
    timeout: float,
) -> list[tuple[str, str]]:
    """:func:`hash_key_files` in a child running as ``uid``/``gid``."""
    from bootseer.asuser import UserChild, UserChildError

    child = UserChild.start(
        uid, gid, lambda _i, _o: hash_key_files(files, work_dir, max_bytes), groups=groups
    )
    try:
        pairs = child.result(timeout=timeout)
    except UserChildError as exc:
        raise KeyInputError(f"{exc} (read as uid {uid})") from None
    return [(str(n), str(d)) for n, d in pairs]


def job_image(env: Mapping[str, str] = os.environ) -> str | None:
    """The image a job's tasks name, as ``--bootseer-image`` gave it: the key must not
    see ``$BOOTSEER_IMAGE``, the agent's lazy file, whose path changes with every job."""
    return env.get("BOOTSEER_IMAGE_REF") or env.get("BOOTSEER_IMAGE")


def image_identity(image: str | None) -> str:
    """What stands for the container image in the key.

    A registered ``NAME:TAG`` is its name until the image registry offers digests; a
    path is its path, size and modification time (hashing a 30 GB image in the
    prolog would cost more than the install it saves).
    """
    if not image:
        return ""
    if not image.startswith("/"):
        return f"name:{image}"
    try:
        st = os.stat(image)
    except OSError:
        return f"path:{image}:missing"
    return f"path:{image}:{st.st_size}:{st.st_mtime_ns}"


def os_release(path: str = "/etc/os-release") -> str:
    try:
        with open(path) as f:
            fields = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
    except OSError:
        return "unknown"
    return f"{fields.get('ID', '?').strip(chr(34))} {fields.get('VERSION_ID', '?').strip(chr(34))}"


@functools.lru_cache(maxsize=8)
def python_abi(python: str) -> str:
    """Version and ABI tag of the interpreter the site names (``deps.python``)."""
    try:
        out = subprocess.run(
            [
                python,
                "-c",
                "import sys,sysconfig;"
                "print(sys.version.split()[0], sysconfig.get_config_var('SOABI'))",
            ],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
            env={"PATH": "/usr/bin:/bin"},
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "none"
    return out or "none"


def gpu_identity(root: str = "/proc/driver/nvidia") -> str:
    """GPU models and driver from the NVIDIA driver's /proc files (no nvidia-smi start-up)."""
    try:
        with open(f"{root}/version") as f:
            m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9][0-9.]*)", f.read())
        driver = m.group(1) if m else "unknown"
    except OSError:
        return "none"
    models = set()
    for info in glob.glob(f"{root}/gpus/*/information"):
        try:
            with open(info) as f:
                for line in f:
                    if line.startswith("Model:"):
                        models.add(line.split(":", 1)[1].strip())
        except OSError:
            continue
    return f"driver {driver}; " + ", ".join(sorted(models) or ["no gpu"])


def key_inputs(
    *,
    scope: str,
    prefix: str,
    key_files: Sequence[tuple[str, str]],
    image: str | None,
    python: str,
) -> KeyInputs:
    """Key inputs for this node. With an image, the image stands for the OS and Python."""
    ident = image_identity(image)
    return KeyInputs(
        scope=scope,
        prefix=prefix.rstrip("/") or "/",
        key_files=tuple(sorted(key_files)),
        image=ident,
        arch=platform.machine(),
        os_release="image" if ident else os_release(),
        python="image" if ident else python_abi(python),
        gpu=gpu_identity(),
    )
