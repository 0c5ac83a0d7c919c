"""Whose a job is, for the peers' piece rule: from this node's own prolog when it said so,
from Slurm otherwise."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from bootseer.agent.jobscope import JobScopes
from bootseer.agentapi.jobs import FetchPiece
from bootseer.agentapi.requests import parse_request
from bootseer.slurmjobs import JobOwner


def test_a_job_its_prolog_named_costs_slurm_no_query() -> None:
    # On N nodes every serving agent asked squeue once per job: N queries per job start
    # at slurmctld. The prolog's own word (root's FetchPiece) makes the query needless.
    asked: list[int] = []

    def owner(job: int) -> JobOwner | None:
        asked.append(job)
        return JobOwner(os.getuid(), "physics")

    scopes = JobScopes(Path("/nonexistent/squeue"), 1.0, lambda _: None, owner=owner)
    me = pwd.getpwuid(os.getuid()).pw_name
    scopes.learn(7, os.getuid(), "physics")
    scopes.check(7, "", f"deps/user/{me}/k1/data-0.tar.zst")
    scopes.check(7, "", "deps/account/physics/k1/data-0.tar.zst")
    scopes.check(7, "s3://ckpt/", f"{me}/run/units/v1/0")
    assert asked == []
    scopes.check(8, "", f"deps/user/{me}/k1/data-0.tar.zst")  # a job it did not name
    assert asked == [8]


def test_fetch_piece_carries_the_owner_and_defaults_to_unsaid() -> None:
    req = FetchPiece(7, "n[1-2]", "deps/x", 0, 1, "0" * 64, uid=1001, account="physics")
    back = parse_request(req.to_wire())
    assert isinstance(back, FetchPiece)
    assert (back.uid, back.account) == (1001, "physics")
    assert FetchPiece(7, "n1", "deps/x", 0, 1, "0" * 64).uid == -1
