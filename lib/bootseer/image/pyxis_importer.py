"""A pyxis importer (``importer=`` in plugstack.conf) that hands pyxis the lazy image.

pyxis calls ``IMPORTER get IMAGE_URI`` and reads the path of a squashfs file from
stdout; with ``use_squashfuse=1`` it mounts that file with squashfuse instead of
unpacking it, so the container reads the image block by block through the agent.
``IMPORTER release`` may come twice and must not fail.

``get bootseer`` (or ``bootseer://``, or the value of ``$BOOTSEER_IMAGE``) answers
with the job's lazy image: ``$BOOTSEER_IMAGE`` if pyxis passed it on, else the agent's
answer for ``$SLURM_JOB_ID`` (a user may ask about their own jobs). Any other URI
goes to ``enroot import``, as pyxis would do without an importer::

    srun --container-image=bootseer python3 train.py      # with --bootseer-image=...
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BOOTSEER_URIS = ("bootseer", "bootseer://", "bootseer:")


def _lazy_image() -> str:
    path = os.environ.get("BOOTSEER_IMAGE", "")
    if path and os.path.isfile(path):
        return path
    from bootseer.config import load_config
    from bootseer.image.client import AgentClient
    from bootseer.nodepaths import NodePaths, node_name

    cfg = load_config().for_node(node_name())
    job = int(os.environ.get("SLURM_JOB_ID", "0"))
    return AgentClient(NodePaths(cfg).agent_socket).status(job).path


def _fallback_path() -> Path:
    runtime = os.environ.get("PYXIS_RUNTIME_PATH", "/run/pyxis")
    uid, job, step = (
        os.environ.get(v, "0") for v in ("SLURM_JOB_UID", "SLURM_JOB_ID", "SLURM_STEP_ID")
    )
    return Path(runtime) / uid / f"{job}.{step}.squashfs"


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("get", "release"):
        print("usage: bootseer-importer get IMAGE_URI | release", file=sys.stderr)
        return 2
    if argv[0] == "release":
        _fallback_path().unlink(missing_ok=True)  # the lazy image is the epilog's to release
        return 0
    if len(argv) != 2:
        print("usage: bootseer-importer get IMAGE_URI", file=sys.stderr)
        return 2
    uri = argv[1]
    if uri in BOOTSEER_URIS or uri == os.environ.get("BOOTSEER_IMAGE"):
        try:
            print(_lazy_image())
        except Exception as exc:
            print(
                f"bootseer-importer: no lazy image for this job: {exc} "
                "(was the job submitted with --bootseer-image?)",
                file=sys.stderr,
            )
            return 1
        return 0
    out = _fallback_path()
    out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    r = subprocess.run(["enroot", "import", "--output", str(out), uri], stdout=sys.stderr)
    if r.returncode != 0:
        return r.returncode
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
