"""The checkpoint door's contract (bootseer.agentapi.ckpt): what a client sends is what the
agent parses, and whatever is malformed or too big is a bad request before the agent
looks up a user, opens a store or touches a descriptor."""

from __future__ import annotations

from typing import Any

import pytest

from bootseer.agentapi.ckpt import (
    MAX_NAME,
    MAX_PATHS,
    CkptEntry,
    CkptGet,
    CkptList,
    CkptListReply,
    CkptPut,
    CkptRemove,
    CkptVerify,
    CkptVerifyReply,
)
from bootseer.agentapi.errors import AgentBadRequest
from bootseer.agentapi.requests import parse_request


@pytest.mark.parametrize(
    "req",
    [
        CkptPut("llama", "step1/model.pt"),
        CkptGet("team/llama", "a.bin"),
        CkptList("llama"),
        CkptList("llama", "step1"),
        CkptRemove("llama", ("a", "b/c")),
        CkptVerify("llama", ""),
    ],
)
def test_every_request_is_parsed_back_as_it_was_sent(req: Any) -> None:
    assert parse_request(req.to_wire()) == req


@pytest.mark.parametrize(
    "doc",
    [
        {"op": "ckpt_put", "ns": "p"},  # no path
        {"op": "ckpt_get", "ns": "p", "path": ""},
        {"op": "ckpt_ls", "path": "x"},  # no namespace
        {"op": "ckpt_ls", "ns": ["p"]},
        {"op": "ckpt_ls", "ns": "p", "path": 7},
        {"op": "ckpt_ls", "ns": "a" * (MAX_NAME + 1)},
        {"op": "ckpt_rm", "ns": "p", "paths": []},
        {"op": "ckpt_rm", "ns": "p", "paths": "a"},
        {"op": "ckpt_rm", "ns": "p", "paths": ["a"] * (MAX_PATHS + 1)},
        {"op": "ckpt_rm", "ns": "p", "paths": ["a", 1]},
        {"op": "ckpt_gc", "ns": "p"},  # no door for an admin action
        {"op": "ckpt_", "ns": "p"},
    ],
)
def test_malformed_or_oversized_requests_are_bad_requests(doc: dict[str, Any]) -> None:
    with pytest.raises(AgentBadRequest):
        parse_request(doc)


def test_the_user_is_never_taken_from_the_request() -> None:
    req = parse_request({"op": "ckpt_ls", "ns": "p", "user": "alice", "uid": 0})
    assert req == CkptList("p") and not hasattr(req, "user")


def test_replies_come_back_typed() -> None:
    entry = CkptEntry("m.bin", False, size=3, mtime=1.0)
    listing = CkptListReply([entry], left_out=2)
    back = CkptListReply.from_wire(listing.to_wire())
    assert back == listing
    v = CkptVerifyReply(1, 3, ["x: unit 0: checksum mismatch"], 0)
    assert CkptVerifyReply.from_wire(v.to_wire()) == v
