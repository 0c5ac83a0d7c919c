"""Every path bootseer keeps on a node, and the node name that ``%n`` stands for.

The site config names three roots (``[paths]``); everything else derives from them
here unless the config sets it (``[image]``'s, ``[ckpt] mount_root``)::

    <run_dir>/jobs/<job_id>/              the job dir (hooks.jobdir), removed by the epilog; 0711
    <run_dir>/jobs/<job_id>/env           what the SPANK plugin puts into the tasks; 0600,
                                          first line "#bootseer-env <ENV_CONTRACT>"
    <run_dir>/jobs/<job_id>/<step>/       what a step keeps from prolog to epilog; 0700
    <run_dir>/jobs/<job_id>/deps/prolog.json   the deps prolog's state, for the epilog; 0600
    <run_dir>/jobs/<job_id>/deps/job/     the job user's (0700): install.json from
                                          `bootseer deps run`, and prolog.json, its copy
    <run_dir>/phases/<job_id>/            the phase spool (outlives the job dir)
    <run_dir>/ckpt/<job_id>               checkpoint mounts        ([ckpt] mount_root)
    <run_dir>/agent.sock                  the node agent's socket  ([image] socket)
    <run_dir>/images/<job_id>.sqsh        the agent's FUSE mount   ([image] mount_dir)
    <cache_dir>/image/                    verified blocks          ([image] cache_dir)
    <cache_dir>/image/jobs/<job_id>.json  the agent's restart state
    <cache_dir>/deps/{locks,stamps}/      one restore per prefix per node
    <cache_dir>/records/                  sealed records read once per node (recordcache)
    <cache_dir>/ckpt-stage/               ckpt writes out of order   ([ckpt] stage_dir)
    <log_dir>/<node>.log                  the hooks' log
    <log_dir>/<node>-agent.log            the agent's log
    <log_dir>/ckpt/<job_id>.log           a checkpoint mount daemon's log

``%n`` in a configured path is the node name, as in slurm.conf, so that several slurmd
on one machine (slurm-dev) keep apart. :func:`node_name` is the one way Python finds
it; the SPANK plugin (spank/bootseer.c) computes the env file's path itself, from the
short host name, and ``tests/base/test_nodepaths.py`` holds the two to one answer.

    >>> from pathlib import Path
    >>> from bootseer.nodename import expand
    >>> job_env(Path(expand("/var/tmp/dev/nodes/%n/run", "n1")), 42)
    PosixPath('/var/tmp/dev/nodes/n1/run/jobs/42/env')

Nothing here imports more than ``os``: a job's phase mark resolves its spool with it.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # not typing's: a mark from a job script pays for every import
if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from bootseer.config import SiteConfig

JOBS = "jobs"
JOB_ENV = "env"  # spank/bootseer.c: JOB_ENV_FORMAT
# What the SPANK plugin and the hooks agree on about the env file (where, whose, what
# format): its first line is ENV_HEADER and this number, and the plugin uses a file of its
# own contract only, saying why otherwise (spank/bootseer.c: ENV_CONTRACT, ENV_HEADER;
# bootseer doctor's "plugin" check reads the installed plugin's). Raise it whenever the
# two must change together. 1: the file 0644, read as the job's user (no header line).
ENV_CONTRACT = 2
ENV_HEADER = "#bootseer-env"
# Every variable the prolog may write into the env file, and so every one the plugin
# unsets where the node's file does not set it (spank/bootseer.c: env_names): a task gets
# its own node's, never one srun passed on from the node that ran the batch script.
ENV_NAMES = (
    "BOOTSEER_AGENT_SOCKET",
    "BOOTSEER_CKPT",
    "BOOTSEER_DEPS_KEY",
    "BOOTSEER_DEPS_PREFIX",
    "BOOTSEER_IMAGE",
    "BOOTSEER_IMAGE_REF",
    "BOOTSEER_NOTICE",
    "BOOTSEER_PHASE_MARKS",
)
SPOOLS = "phases"
DEPS_STATE = "prolog.json"


def host_name() -> str:
    """The short host name: the node name on a cluster, and in slurm-dev, whose slurmds
    each run in a UTS namespace named for their node. The SPANK plugin uses it (a job's
    environment, ``$SLURMD_NODENAME`` included, is its user's to change)."""
    return os.uname().nodename.split(".")[0]


def node_name(env: Mapping[str, str] | None = None) -> str:
    """This node's name: ``$SLURMD_NODENAME`` where slurmd set it, else :func:`host_name`."""
    env = os.environ if env is None else env
    return env.get("SLURMD_NODENAME") or host_name()


def root_only_dir(path: Path, sticky_ok: bool = False, follow: bool = False) -> None:
    """``path`` (made if missing) a directory of root's that no one else may write: the
    group's and others' write taken back from one of root's (a first hook's ``mkdir -p``
    under a umask of 0 made ``<run_dir>/jobs`` 0777); ``sticky_ok``: a sticky one, as
    ``/tmp``, is left as it is. :class:`~bootseer.errors.StepError` if it is not root's
    directory (a link, another user's): nothing of a job goes there. ``follow``: a link
    at ``path`` itself is followed (``[paths] run_dir``, the admin's, may be one)."""
    import stat

    from bootseer.errors import StepError

    path.mkdir(parents=True, exist_ok=True, mode=0o755)
    st = os.stat(path) if follow else os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise StepError(f"{path} is not a directory of root's: no job state goes there")
    if st.st_mode & 0o022 and not (sticky_ok and st.st_mode & stat.S_ISVTX):
        os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o022)


def job_dir(run_dir: Path, job_id: int) -> Path:
    return run_dir / JOBS / str(job_id)


def job_env(run_dir: Path, job_id: int) -> Path:
    return job_dir(run_dir, job_id) / JOB_ENV


def step_dir(run_dir: Path, job_id: int, step: str) -> Path:
    return job_dir(run_dir, job_id) / step


def deps_state(run_dir: Path, job_id: int) -> Path:
    return step_dir(run_dir, job_id, "deps") / DEPS_STATE


def install_record(run_dir: Path, job_id: int) -> Path:
    return step_dir(run_dir, job_id, "deps") / "job" / "install.json"


def deps_job_state(run_dir: Path, job_id: int) -> Path:
    """The job user's copy of the deps prolog's state (``bootseer deps run`` reads it)."""
    return install_record(run_dir, job_id).with_name(DEPS_STATE)


def spools(run_dir: Path) -> Path:
    return run_dir / SPOOLS


def spool_dir(run_dir: Path, job_id: int) -> Path:
    return spools(run_dir) / str(job_id)


def deps_cache(cache_dir: Path) -> Path:
    return cache_dir / "deps"


def hook_log(log_dir: Path, node: str) -> Path:
    return log_dir / f"{node}.log"


class NodePaths:
    """One node's paths from its site config (``SiteConfig.for_node``: no ``%n`` left).

    >>> from bootseer.config import SiteConfig
    >>> paths = NodePaths(SiteConfig.from_mapping({"paths": {"run_dir": "/run/%n"}}).for_node("n2"))
    >>> paths.agent_socket, paths.ckpt_mounts
    (PosixPath('/run/n2/agent.sock'), PosixPath('/run/n2/ckpt'))
    """

    def __init__(self, cfg: SiteConfig) -> None:
        p, image = cfg.paths, cfg.image
        self.run_dir, self.cache_dir, self.log_dir = p.run_dir, p.cache_dir, p.log_dir
        self.agent_socket = image.socket or p.run_dir / "agent.sock"
        self.image_mounts = image.mount_dir or p.run_dir / "images"
        self.image_cache = image.cache_dir or p.cache_dir / "image"
        self.agent_state = self.image_cache / JOBS
        self.ckpt_mounts = cfg.ckpt.mount_root or p.run_dir / "ckpt"
        self.ckpt_stage = cfg.ckpt.stage_dir or p.cache_dir / "ckpt-stage"
        self.deps_cache = deps_cache(p.cache_dir)
        self.records = p.cache_dir / "records"

    def job_dir(self, job_id: int) -> Path:
        return job_dir(self.run_dir, job_id)

    def deps_state(self, job_id: int) -> Path:
        return deps_state(self.run_dir, job_id)

    def install_record(self, job_id: int) -> Path:
        return install_record(self.run_dir, job_id)

    def spool_dir(self, job_id: int) -> Path:
        return spool_dir(self.run_dir, job_id)

    def image_file(self, name: str) -> Path:
        return self.image_mounts / name

    def hook_log(self, node: str) -> Path:
        return hook_log(self.log_dir, node)

    def agent_log(self, node: str) -> Path:
        return self.log_dir / f"{node}-agent.log"

    def ckpt_log(self, job_id: int) -> Path:
        return self.log_dir / "ckpt" / f"{job_id}.log"
