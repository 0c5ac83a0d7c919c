from __future__ import annotations

import pytest

from bootseer.context import JobContext, wants_bootseer
from bootseer.errors import ContextError, OptionError

BASE = {
    "SLURM_JOB_ID": "42",
    "SLURM_JOB_USER": "ada",
    "SLURM_JOB_UID": "1000",
    "SLURM_JOB_GID": "100",
    "SLURMD_NODENAME": "gpu02",
    "SLURM_NODELIST": "gpu[01-03],cpu7",
    "SLURM_JOB_RESTART_COUNT": "2",
    "SLURM_JOB_ACCOUNT": "ml",
    "SPANK_BOOTSEER_MODE": "on",
    "SPANK_BOOTSEER_IMAGE": "/img/a.sqsh",
}


def test_context_from_prolog_env() -> None:
    ctx = JobContext.from_env(BASE)
    assert (ctx.job_id, ctx.user, ctx.uid, ctx.gid) == (42, "ada", 1000, 100)
    assert ctx.nodes == ("cpu7", "gpu01", "gpu02", "gpu03")
    assert ctx.restart_count == 2 and ctx.account == "ml"
    assert ctx.options.image == "/img/a.sqsh" and ctx.options.deps is None
    assert not ctx.first_node


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"SLURM_JOB_ID": ""}, ContextError, "SLURM_JOB_ID is not set"),
        ({"SLURM_JOB_UID": "x"}, ContextError, "not a number"),
        ({"SLURM_JOB_USER": "../root"}, ContextError, "not a user name"),
        ({"SLURMD_NODENAME": ""}, ContextError, "SLURMD_NODENAME"),
        ({"SLURM_NODELIST": "n[1-"}, ContextError, "cannot parse node list"),
        ({"SPANK_BOOTSEER_IMAGE": "/a/../etc/shadow"}, OptionError, "--bootseer-image"),
    ],
)
def test_bad_environment_is_refused(change: dict[str, str], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        JobContext.from_env({**BASE, **change})


def test_wants_bootseer() -> None:
    assert wants_bootseer({"SPANK_BOOTSEER_MODE": "on"})
    assert not wants_bootseer({"SPANK_BOOTSEER_MODE": "off"})
    assert not wants_bootseer({})
