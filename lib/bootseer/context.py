"""The job context: the one seam between Slurm's environment and bootseer's logic.

The hooks build it from the environment Slurm gives the Prolog/Epilog; tests build
it by hand. Everything downstream takes a :class:`JobContext`, never ``os.environ``.

    >>> ctx = JobContext.from_env({
    ...     "SLURM_JOB_ID": "42", "SLURM_JOB_USER": "ada", "SLURM_JOB_UID": "1000",
    ...     "SLURM_JOB_GID": "1000", "SLURMD_NODENAME": "n1", "SLURM_NODELIST": "n[1-2]",
    ...     "SPANK_BOOTSEER_MODE": "on"})
    >>> ctx.nodes, ctx.options.enabled
    (('n1', 'n2'), True)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bootseer.errors import ContextError
from bootseer.options import Options, parse_options
from bootseer.users import is_user_name

# The SPANK plugin copies each checked option into the job control environment
# (spank_job_control_setenv); Slurm hands those to the Prolog/Epilog as SPANK_<NAME>.
OPTION_ENV = {
    "mode": "SPANK_BOOTSEER_MODE",
    "image": "SPANK_BOOTSEER_IMAGE",
    "deps": "SPANK_BOOTSEER_DEPS",
    "ckpt": "SPANK_BOOTSEER_CKPT",
}


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ContextError(f"${name} is not set: is this running as a Slurm Prolog/Epilog?")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ContextError(f"${name}={raw!r} is not a number") from None


def expand_nodes(nodelist: str) -> tuple[str, ...]:
    """``n[1-3],gpu07`` -> ``('n1', 'n2', 'n3', 'gpu07')``, via ClusterShell."""
    if not nodelist:
        return ()
    from ClusterShell.NodeSet import NodeSet, NodeSetParseError

    try:
        return tuple(NodeSet(nodelist))
    except NodeSetParseError as exc:
        raise ContextError(f"cannot parse node list {nodelist!r}: {exc}") from None


def fold_nodes(nodes: Sequence[str]) -> str:
    """``('n1', 'n2', 'n3', 'gpu07')`` -> ``gpu07,n[1-3]``: a job's nodes as one short
    string (10,000 nodes in a few bytes where the names allow), which :func:`expand_nodes`
    turns back into the same tuple when ``nodes`` came from it (Slurm's node order is
    ClusterShell's)."""
    from ClusterShell.NodeSet import NodeSet

    return str(NodeSet.fromlist(nodes))


@dataclass(frozen=True)
class JobContext:
    job_id: int
    user: str
    uid: int
    gid: int
    node: str
    nodes: tuple[str, ...]
    restart_count: int = 0
    job_name: str = ""
    account: str = ""
    partition: str = ""
    work_dir: str = ""
    gpus_per_node: int = 0
    options: Options = field(default_factory=Options)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> JobContext:
        user = env.get("SLURM_JOB_USER", "")
        if not is_user_name(user):
            raise ContextError(f"$SLURM_JOB_USER={user!r} is not a user name")
        node = env.get("SLURMD_NODENAME", "")
        if not node:
            raise ContextError("$SLURMD_NODENAME is not set: is this running under slurmd?")
        nodelist = env.get("SLURM_NODELIST") or env.get("SLURM_JOB_NODELIST") or node
        return cls(
            job_id=_int(env, "SLURM_JOB_ID"),
            user=user,
            uid=_int(env, "SLURM_JOB_UID"),
            gid=_int(env, "SLURM_JOB_GID"),
            node=node,
            nodes=expand_nodes(nodelist),
            restart_count=_int(env, "SLURM_JOB_RESTART_COUNT", 0),
            job_name=env.get("SLURM_JOB_NAME", ""),
            account=env.get("SLURM_JOB_ACCOUNT", ""),
            partition=env.get("SLURM_JOB_PARTITION", ""),
            work_dir=env.get("SLURM_JOB_WORK_DIR", "") or env.get("SPANK_BOOTSEER_WORKDIR", ""),
            gpus_per_node=gpus_on_node(env),
            options=options_from_env(env),
        )

    @property
    def first_node(self) -> bool:
        """True on the job's first node: the one that does once-per-job work (uploads)."""
        return not self.nodes or self.node == self.nodes[0]

    def tag(self) -> str:
        return f"job={self.job_id} node={self.node}"


def gpus_on_node(env: Mapping[str, str]) -> int:
    """GPUs allocated to the job on this node: ``$SLURM_JOB_GPUS`` (prolog, ``0,1,...``)
    or ``$SLURM_GPUS_ON_NODE`` (tasks); 0 where there are none."""
    ids = env.get("SLURM_JOB_GPUS", "")
    if ids:
        return len([i for i in ids.split(",") if i])
    raw = env.get("SLURM_GPUS_ON_NODE", "")
    return int(raw) if raw.isdigit() else 0


def options_from_env(env: Mapping[str, str]) -> Options:
    return parse_options(**{name: env.get(var) for name, var in OPTION_ENV.items()})


def wants_bootseer(env: Mapping[str, str]) -> bool:
    """The cheap test the hooks make before importing anything heavy."""
    mode = env.get(OPTION_ENV["mode"])
    return bool(mode) and mode != "off"
