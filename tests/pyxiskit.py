"""Call an importer exactly as pyxis 0.24 does (``importer.c``, ``pyxis_slurmstepd.c``).

pyxis' ``importer_exec`` forks in slurmstepd and, in the child: stdin on /dev/null,
stdout on a pipe, stderr on an in-memory log; every other descriptor closed; the job's
groups, gid and uid; then ``enroot_set_env``: the environment cleared but for
slurmstepd's ``PATH``, the job's environment imported less a deny list,
``SLURM_JOB_UID``/``SLURM_JOB_GID`` from the job's credentials, ``PYXIS_RUNTIME_PATH``
and ``PYXIS_VERSION``; ``execve(importer, [importer, "get", URI])`` in slurmstepd's
working directory. The parent reads the first line of stdout (less its newline) as the
squashfs path and prints the log only when the exit status is not 0.

Run as a program (``python3 -m tests.pyxiskit IMPORTER URI``) inside a job step, it
makes the call with the step's environment as the job's and prints what pyxis would
have got.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass

PYXIS_VERSION = "0.24.0"
# slurmd's PATH under systemd (pyxis keeps slurmstepd's, never the job's).
SLURMSTEPD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# pyxis_slurmstepd.c: enroot_deny_env
DENY = (
    "PATH=",
    "LD_LIBRARY_PATH=",
    "LD_PRELOAD=",
    "SLURM_PROCID=",
    "SLURM_LOCALID=",
    "SLURM_TASK_PID=",
    "PMIX_RANK=",
    "PMI_FD=",
    "ENROOT_LIBRARY_PATH=",
    "ENROOT_SYSCONF_PATH=",
    "ENROOT_RUNTIME_PATH=",
    "ENROOT_CACHE_PATH=",
    "ENROOT_DATA_PATH=",
    "ENROOT_TEMP_PATH=",
    "ENROOT_ZSTD_OPTIONS=",
    "ENROOT_TRANSFER_RETRIES=",
    "ENROOT_CONNECT_TIMEOUT=",
    "ENROOT_MAX_CONNECTIONS=",
    "ENROOT_ALLOW_HTTP=",
)


@dataclass(frozen=True)
class ImporterCall:
    returncode: int
    path: str | None  # the first line of stdout, as pyxis reads it
    stdout: str
    log: str  # the importer's stderr (pyxis prints it only on failure)


def enroot_uri(image: str) -> str:
    """What pyxis passes for ``--container-image=image`` (enroot_container_create)."""
    if image.startswith(("docker://", "dockerd://")):
        return image
    return f"docker://{image}"


def pyxis_env(
    job_env: Mapping[str, str],
    uid: int,
    gid: int,
    runtime_path: str = "/run/pyxis",
    path: str = SLURMSTEPD_PATH,
) -> dict[str, str]:
    """``slurm_clear_env`` then ``enroot_set_env`` (without the --container-* flags)."""
    env = {"PATH": path}
    for k, v in job_env.items():
        if not f"{k}=".startswith(DENY):
            env[k] = v
    env["SLURM_JOB_UID"] = str(uid)
    env["SLURM_JOB_GID"] = str(gid)
    env["PYXIS_RUNTIME_PATH"] = runtime_path
    env["PYXIS_VERSION"] = PYXIS_VERSION
    return env


def call(
    importer: str,
    args: list[str],
    job_env: Mapping[str, str],
    user: str | None = None,
    cwd: str = "/",
    runtime_path: str = "/run/pyxis",
    path: str = SLURMSTEPD_PATH,
    timeout: float = 120,
) -> ImporterCall:
    """``importer_exec_get`` (args ``["get", URI]``) or ``importer_exec_release``
    (``["release"]``) as the job's ``user`` (default: the caller)."""
    pw = pwd.getpwnam(user) if user else pwd.getpwuid(os.getuid())
    env = pyxis_env(job_env, pw.pw_uid, pw.pw_gid, runtime_path, path)
    root = os.geteuid() == 0  # pyxis: setgroups, setregid, setreuid (no-ops as the user)
    groups = os.getgrouplist(pw.pw_name, pw.pw_gid) if root else None
    with tempfile.TemporaryFile() as log:  # pyxis: a memfd
        r = subprocess.run(
            [importer, *args],
            executable=importer,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if args[:1] == ["get"] else log,
            stderr=log,
            env=env,
            cwd=cwd,
            close_fds=True,
            timeout=timeout,
            user=pw.pw_uid if root else None,
            group=pw.pw_gid if root else None,
            extra_groups=groups,
        )
        log.seek(0)
        text = log.read().decode(errors="replace")
    out = (r.stdout or b"").decode(errors="replace")
    first = out.split("\n", 1)[0] if out else None
    return ImporterCall(r.returncode, first or None, out, text)


def main(argv: list[str]) -> int:
    importer, image = argv
    got = call(importer, ["get", enroot_uri(image)], os.environ, cwd=os.getcwd())
    print(f"get rc={got.returncode} path={got.path}")
    if got.returncode:
        print(got.log, file=sys.stderr)
    for _ in range(2):  # pyxis may release twice (after create, and at task cleanup)
        rel = call(importer, ["release"], os.environ, cwd=os.getcwd())
        print(f"release rc={rel.returncode}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
