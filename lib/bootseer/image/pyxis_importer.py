"""A pyxis importer (``importer=`` in plugstack.conf) that hands pyxis the lazy image.

pyxis (``pyxis_slurmstepd.c``, ``importer.c``) runs ``IMPORTER get URI`` as the job's
user, with stdin on /dev/null, stderr into a log it prints only if the importer fails,
the job's environment (less ``PATH``, ``LD_*`` and a few more; slurmstepd's ``PATH``)
plus ``SLURM_JOB_UID``, ``SLURM_JOB_GID``, ``PYXIS_RUNTIME_PATH`` and ``PYXIS_VERSION``,
and reads the first line of stdout as the path of a squashfs file. With
``use_squashfuse=1`` it mounts that file instead of unpacking it, so the container reads
the image block by block through the agent. ``IMPORTER release`` may come twice and
must not fail.

pyxis calls the importer only for an image that does not start with ``/`` or ``.``, and
puts ``docker://`` in front of it unless it starts with ``docker://`` or ``dockerd://``:
``--container-image=bootseer`` arrives as ``get docker://bootseer``. That name (and plain
``bootseer``, for a call by hand) answers with the job's lazy image: ``$BOOTSEER_IMAGE``,
else the agent's answer for ``$SLURM_JOB_ID``. Every other URI is a Docker image that
is not ours and goes to ``enroot import``, as pyxis would do without an importer::

    srun --container-image=bootseer python3 train.py      # with --bootseer-image=...
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bootseer.errors import describe

# What pyxis passes for --container-image=bootseer (or =docker://bootseer), and the
# bare name for a call by hand. ``docker://bootseer:TAG``, ``dockerd://bootseer`` and a
# registry's ``.../bootseer`` name real Docker images: they go to enroot.
OUR_URIS = frozenset({"docker://bootseer", "bootseer"})


def is_ours(uri: str) -> bool:
    """Whether ``uri`` (as pyxis passes it) asks for the job's lazy image."""
    return uri in OUR_URIS


def _lazy_image() -> str:
    path = os.environ.get("BOOTSEER_IMAGE", "")
    if path and os.path.isfile(path):
        return path
    from bootseer.agentapi.client import AgentClient
    from bootseer.agentapi.jobs import Status
    from bootseer.config import load_config
    from bootseer.nodepaths import NodePaths, node_name

    cfg = load_config().for_node(node_name())
    job = int(os.environ.get("SLURM_JOB_ID", "0"))
    return AgentClient(NodePaths(cfg).agent_socket).ask(Status(job)).path


def _fallback_path() -> Path:
    """Where ``enroot import`` writes a Docker image: pyxis' own path for it."""
    runtime = os.environ.get("PYXIS_RUNTIME_PATH", "/run/pyxis")
    uid, job, step = (
        os.environ.get(v, "0") for v in ("SLURM_JOB_UID", "SLURM_JOB_ID", "SLURM_STEP_ID")
    )
    return Path(runtime) / uid / f"{job}.{step}.squashfs"


def _get(uri: str) -> int:
    if is_ours(uri):
        try:
            path = _lazy_image()
        except Exception as exc:
            print(
                f"bootseer-importer: no lazy image for job "
                f"{os.environ.get('SLURM_JOB_ID', '?')}: {describe(exc)} "
                "(submit the job with --bootseer-image=IMAGE to use "
                "--container-image=bootseer)",
                file=sys.stderr,
            )
            return 1
        print(path, flush=True)
        return 0
    out = _fallback_path()
    out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    r = subprocess.run(
        ["enroot", "import", "--output", str(out), uri], stdin=subprocess.DEVNULL, stdout=sys.stderr
    )
    if r.returncode != 0:
        return r.returncode
    print(out, flush=True)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["get"] and len(argv) == 2:
        return _get(argv[1])
    if argv == ["release"]:
        _fallback_path().unlink(missing_ok=True)  # the lazy image is the epilog's to release
        return 0
    print("usage: bootseer-importer get IMAGE_URI | release", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
