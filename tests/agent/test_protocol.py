"""The agent's socket contract: typed requests, and error kinds that cross as exception classes.

A real :class:`AgentServer` on a unix socket (no FUSE, no Slurm): what the agent raises
is what the client raises, and the image step falls back on exactly the classes that
mean "the agent cannot serve this in time".
"""

from __future__ import annotations

import functools
import json
import os
import select
import socket
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bootseer.agent.assembly import Agent
from bootseer.agent.handler import Caller, handle
from bootseer.agent.server import AgentServer
from bootseer.agentapi.ckpt import CkptGet, CkptList, CkptPut, CkptRemove, CkptUsage, CkptVerify
from bootseer.agentapi.client import AgentClient
from bootseer.agentapi.errors import (
    ERRORS,
    AgentBadRequest,
    AgentError,
    AgentNotFound,
    AgentPending,
    AgentRefused,
    AgentTimeout,
    AgentUnavailable,
    error_reply,
)
from bootseer.agentapi.jobs import (
    AgentRestart,
    FetchPiece,
    FirstStep,
    Ping,
    Prepare,
    Release,
    Stats,
    Status,
)
from bootseer.agentapi.requests import parse_request
from bootseer.agentapi.views import MAX_VIEW_SCOPES, DepsList, DepsShow, ImageList, ImageShow
from bootseer.agentapi.wire import Reply, Request, encode
from bootseer.config import SiteConfig
from bootseer.errors import StepError
from bootseer.image import step
from bootseer.options import Options
from bootseer.stepapi import StepCall
from tests import hookkit
from tests.hookkit import job_context
from tests.imagekit import node_config, site_config
from tests.waiting import wait_until


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[Agent, AgentClient]]:
    cfg = node_config(tmp_path)
    agent = Agent(cfg, "t1")
    server = AgentServer(agent.paths.agent_socket, agent)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield agent, AgentClient(agent.paths.agent_socket)
    finally:
        server.shutdown()
        server.server_close()
        agent.close()


def test_the_agent_starts_while_its_s3_store_does_not_answer(tmp_path: Path) -> None:
    """The store's link busy or the store down as the agent starts is no reason for it to
    exit (it did: "cannot open store ... Connection timed out after 5001 milliseconds",
    and slurm-dev's startup bench stopped with the node's agent gone)."""
    secrets = tmp_path / "secrets.toml"  # root's, as the agent's is: it then signs requests
    secrets.write_text('[store]\naccess_key = "k"\nsecret_key = "s"\n')
    secrets.chmod(0o600)
    with socket.socket() as quiet:  # a port nothing answers on: bound, never listening
        quiet.bind(("127.0.0.1", 0))
        port = quiet.getsockname()[1]
        cfg = SiteConfig.from_mapping(
            {
                **site_config(tmp_path),
                "store": {
                    "secrets_file": str(secrets),
                    "uri": f"s3://bucket/store?endpoint_override=127.0.0.1:{port}&scheme=http",
                },
            }
        ).for_node("t1")
        agent = Agent(cfg, "t1")
        try:
            assert agent.store.uri.startswith("s3://bucket/store")
        finally:
            agent.close()


def test_requests_round_trip_and_bad_ones_are_refused_as_bad_requests() -> None:
    p = Prepare(42, 1000, 1000, "/shared/a.sqsh", "refresh", 30.0)
    assert parse_request(p.to_wire()) == p
    assert parse_request(Status(7).to_wire()) == Status(7)
    bad: object
    for bad in (
        [],
        {"op": "nap"},
        {"op": "status"},
        {"op": "status", "job_id": True},
        {"op": "prepare", "job_id": 1, "uid": -1, "gid": 0, "image": "a"},
        {"op": "prepare", "job_id": 1, "uid": 0, "gid": 0, "image": "a", "mode": "x"},
        {"op": "prepare", "job_id": 1, "uid": 0, "gid": 0, "image": "a", "deadline": 0},
    ):
        with pytest.raises(AgentBadRequest):
            parse_request(bad)
    # The image is the job's option, checked where the agent reads the request.
    for ref in ("/a/../etc/shadow", "Upper:1", "rel/path.sqsh"):
        with pytest.raises(AgentBadRequest, match="--bootseer-image"):
            parse_request({**p.to_wire(), "image": ref})


def test_a_users_views_round_trip_and_bad_ones_are_refused() -> None:
    for req in (
        ImageShow("pytorch:24.05"),
        DepsList(("user/alice", "cluster")),
        DepsList(),
        DepsShow("", "a" * 32),
    ):
        assert parse_request(json.loads(encode(req.to_wire()))) == req
    bad: object
    for bad in (
        {"op": "image_show"},
        {"op": "image_show", "ref": 7},
        {"op": "image_show", "ref": "x" * 2000},
        {"op": "deps_ls", "scopes": "user/alice"},
        {"op": "deps_ls", "scopes": ["user/a"] * (MAX_VIEW_SCOPES + 1)},
        {"op": "deps_show", "scope": "", "key": None},
        {"op": "deps_show", "scope": "user/a\0", "key": "k"},
    ):
        with pytest.raises(AgentBadRequest):
            parse_request(bad)


def test_a_user_sees_the_scopes_her_jobs_restore_from() -> None:
    from bootseer.config import SiteConfig
    from bootseer.deps.views import check_scopes, scopes_of

    assert scopes_of(SiteConfig(), "alice") == ["user/alice"]
    wide = SiteConfig.from_mapping(
        {"deps": {"scopes": ["user", "account", "cluster"], "scontrol": "/nonexistent/scontrol"}}
    )
    # Slurm that cannot say whether it checks accounts: no account scope for anyone.
    assert scopes_of(wide, "alice", lambda: {"acme": {"alice"}}) == ["user/alice", "cluster"]
    assert check_scopes([], ["user/alice"], "alice") == ["user/alice"]
    with pytest.raises(AgentRefused, match="yours: user/mallory"):
        check_scopes(["user/alice"], ["user/mallory"], "mallory")


@pytest.mark.parametrize("cls", list(ERRORS.values()), ids=list(ERRORS))
def test_every_error_kind_reaches_the_client_as_its_class(tmp_path: Path, cls: type) -> None:
    sock = tmp_path / "fake.sock"

    class Answer(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            self.rfile.readline()
            self.wfile.write(encode(error_reply(cls("why"))))

    with socketserver.UnixStreamServer(str(sock), Answer) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        with pytest.raises(AgentError) as exc:
            AgentClient(sock).ask(Status(1))
        server.shutdown()
    assert type(exc.value) is cls
    assert "why" in str(exc.value)


def test_an_unknown_kind_is_the_base_class(tmp_path: Path) -> None:
    sock = tmp_path / "fake.sock"

    class Answer(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            self.rfile.readline()
            self.wfile.write(encode({"ok": False, "error": "later", "kind": "from-the-future"}))

    with socketserver.UnixStreamServer(str(sock), Answer) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        with pytest.raises(AgentError) as exc:
            AgentClient(sock).ask(Ping())
        server.shutdown()
    assert type(exc.value) is AgentError


def test_client_side_kinds(tmp_path: Path) -> None:
    with pytest.raises(AgentUnavailable):
        AgentClient(tmp_path / "none.sock").ask(Ping())

    answered = threading.Event()

    class Silent(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            answered.wait(30)  # silent until the client has given up

    sock = tmp_path / "slow.sock"
    with socketserver.ThreadingUnixStreamServer(str(sock), Silent) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            with pytest.raises(AgentTimeout, match="no answer to status"):
                AgentClient(sock).ask(Status(1), timeout=0.2)
        finally:
            answered.set()
            server.shutdown()


@pytest.mark.root
def test_the_real_server_answers_with_typed_errors(
    agent: tuple[Agent, AgentClient], tmp_path: Path
) -> None:
    _, client = agent
    assert client.ask(Ping()).node == "t1"
    assert client.ask(Stats()).jobs == []
    with pytest.raises(AgentNotFound, match="no prepared image for job 5"):
        client.ask(Status(5))
    with pytest.raises(AgentNotFound, match="no image named 'nope:1'"):
        client.ask(Prepare(5, 0, 0, "nope:1"), timeout=10)
    with pytest.raises(AgentBadRequest, match="unknown op"):
        client.call("nap")
    with pytest.raises(AgentBadRequest, match="--bootseer-image"):
        client.ask(Prepare(5, 0, 0, "/a/../etc/shadow"), timeout=10)
    secret = tmp_path / "secret.sqsh"
    secret.write_bytes(b"hsqs" + bytes(100))
    secret.chmod(0o600)
    with pytest.raises(AgentRefused, match="by uid 4242"):
        client.ask(Prepare(5, 4242, 4242, str(secret)), timeout=10)
    assert client.ask(Release(5)).released is False


def test_users_are_refused_root_ops_and_see_only_their_own_jobs(
    agent: tuple[Agent, AgentClient],
) -> None:
    a, _ = agent
    with pytest.raises(AgentRefused, match="for root"):
        handle(a, Release(5), Caller(1000))
    with pytest.raises(AgentRefused, match="for root"):
        handle(a, Prepare(5, 1000, 1000, "x:1"), Caller(1000))
    with pytest.raises(AgentNotFound):
        handle(a, FirstStep(5), Caller(1000))


# -- the image step decides by class -----------------------------------------------------


def step_call(tmp_path: Path, image: str) -> StepCall:
    return hookkit.step_call(node_config(tmp_path), job_context(Options(mode="on", image=image)))


@pytest.mark.parametrize(
    ("cls", "falls_back"),
    [
        (AgentUnavailable, True),
        (AgentPending, True),
        (AgentTimeout, True),
        (AgentRefused, False),
        (AgentNotFound, False),
        (AgentBadRequest, False),
        (AgentError, False),
    ],
)
def test_image_step_falls_back_by_exception_class(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cls: type[AgentError], falls_back: bool
) -> None:
    image = tmp_path / "img.sqsh"
    image.write_bytes(b"hsqs" + bytes(4096))

    def ask(self: AgentClient, request: Prepare, timeout: float) -> None:
        raise cls("a message that names no kind")

    monkeypatch.setattr(AgentClient, "ask", ask)
    call = step_call(tmp_path, str(image))
    if falls_back:
        result = step.prolog(call)
        assert result.env["BOOTSEER_IMAGE"] == str(image)
        assert "fallback=direct" in result.detail
    else:
        with pytest.raises(StepError, match="a message that names no kind"):
            step.prolog(call)


def full_backlog(path: Path) -> tuple[socket.socket, list[socket.socket]]:
    """A listening socket that accepts nothing yet, and the connections that fill its backlog."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    pending: list[socket.socket] = []
    while len(pending) < 1000:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(str(path))
        except BlockingIOError:
            s.close()
            return listener, pending
        pending.append(s)
    raise AssertionError("the backlog never filled")


def test_a_full_backlog_is_waited_on_not_unavailable(tmp_path: Path) -> None:
    """Mallory's idle connections filled the agent's listen backlog and root's ping failed at
    once with EAGAIN ("unavailable": the prolog gave up on the agent). The client waits for
    room up to its timeout: a backlog that stays full is a timeout..."""
    sock = tmp_path / "full.sock"
    listener, pending = full_backlog(sock)
    try:
        with pytest.raises(AgentTimeout, match="no answer to ping"):
            AgentClient(sock).ask(Ping(), timeout=0.3)
    finally:
        for s in pending:
            s.close()
        listener.close()


def test_a_full_backlog_is_served_once_the_agent_accepts(tmp_path: Path) -> None:
    """...and a backlog that drains lets the waiting call through."""
    sock = tmp_path / "full.sock"
    listener, pending = full_backlog(sock)
    calling = threading.Event()

    def serve() -> None:
        calling.wait(30)
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.setblocking(True)
                conn.settimeout(0.2)
                try:
                    if conn.recv(4096):  # the filler sockets send nothing
                        conn.sendall(encode({"ok": True, "node": "n1", "pid": 1}))
                        return
                except TimeoutError:
                    pass

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        calling.set()
        assert AgentClient(sock).ask(Ping(), timeout=30).node == "n1"
    finally:
        for s in pending:
            s.close()
        server.join(30)
        listener.close()


# One example of every request the agent answers: a new request type fails the two tests
# below until it is listed here, in agentapi.requests.REQUESTS and in agent.handler.HANDLERS.
EXAMPLES: tuple[Request[Any], ...] = (
    Ping(),
    Stats(),
    AgentRestart(when_idle=False),
    Status(7),
    FirstStep(7),
    Release(7),
    Prepare(7, 1000, 1000, "pytorch:24.05", "refresh", 30.0, "n[1-4]"),
    FetchPiece(7, "n[1-4]", "deps/user/a/k/frames", 0, 4096, "ab" * 32, 2, ""),
    ImageList(),
    ImageShow("pytorch:24.05"),
    DepsList(("user/alice",)),
    DepsShow("", "a" * 32),
    CkptPut("llama", "step1/model.pt"),
    CkptGet("llama", "step1/model.pt"),
    CkptList("llama", "step1"),
    CkptRemove("llama", ("a", "b/c")),
    CkptVerify("llama"),
    CkptUsage(),
)


def test_every_request_type_round_trips_and_has_a_handler() -> None:
    from bootseer.agent.handler import HANDLERS
    from bootseer.agentapi.requests import REQUESTS

    assert {type(r) for r in EXAMPLES} == set(REQUESTS.values())
    assert set(HANDLERS) == set(REQUESTS.values())
    for req in EXAMPLES:
        wire = json.loads(encode(req.to_wire()))
        assert parse_request(wire) == req, wire
        assert issubclass(req.reply, Reply) and req.reply is not Reply, req.op


def test_a_piece_request_names_its_digest_and_one_from_before_is_refused() -> None:
    """``FetchPiece.digest`` (BLAKE3, or SHA-256 for what was stored before) was
    ``sha256``: a request of the release before is refused as malformed, never read
    with its field missing, and so is a digest of a hash this release does not know. The
    asker (a prolog, a mount daemon) then reads the store itself."""
    new = FetchPiece(7, "n[1-4]", "deps/user/a/k/frames", 0, 4096, "blake3:" + "ab" * 32)
    wire = json.loads(encode(new.to_wire()))
    assert "sha256" not in wire and parse_request(wire) == new
    old = {**wire, "sha256": "ab" * 32}
    del old["digest"]
    with pytest.raises(AgentBadRequest, match="digest"):
        parse_request(old)
    for bad in ("blake4:" + "ab" * 32, "ab" * 31, "sha256:" + "ab" * 32):
        with pytest.raises(AgentBadRequest, match="piece: digest"):
            parse_request({**wire, "digest": bad})


def test_every_reply_type_round_trips_typed() -> None:
    from bootseer.agentapi.jobs import (
        ByteCounts,
        FillSummary,
        JobReply,
        PeerSummary,
        PrefetchSummary,
        ReleaseReply,
    )

    job = JobReply(
        7, "/run/b/7.sqsh", "ab" * 32, "x:1", 10, 4, 3, 1,
        PrefetchSummary(hot_blocks=2, complete=False),
        FillSummary("done", 1.0, 2.0, 3, 3, 0, 12),
        5, 9.5, 8,
        PeerSummary(4, 4, 1, 0, {"n2": "silent"}, ByteCounts(1, 2), None),
    )  # fmt: skip
    for reply in (job, ReleaseReply(True, "saved", job), ReleaseReply(False)):
        assert type(reply).from_wire(json.loads(encode(reply.to_wire()))) == reply
    # A reply that is not what its type says is the agent's error, not a crash later.
    from bootseer.jsondecode import DecodeError

    with pytest.raises(DecodeError, match="fill"):
        JobReply.from_wire({**job.to_wire(), "fill": {"state": "odd"}})


# -- kept connections (issue 19: no thread and no connection per request) ------------


@pytest.fixture
def served(tmp_path: Path) -> Iterator[AgentServer]:
    """A real AgentServer whose connections idle out after 0.3 s."""
    agent = Agent(node_config(tmp_path), "t1")
    server = AgentServer(agent.paths.agent_socket, agent, idle_timeout=0.3)
    agent.open_connections = server.connections  # as the daemon does
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        agent.close()


@pytest.mark.root
def test_a_kept_connection_carries_requests_and_comes_back_after_idling(
    served: AgentServer,
) -> None:
    """One connection for many requests; the agent closes it once idle, and the next
    request goes again on a new one without the caller seeing it."""
    client = AgentClient(served.agent.paths.agent_socket, keep=2)
    client.one_shot_hint = 0.1  # closed sooner: an agent of before (this one idles 0.3 s)
    for _ in range(20):
        assert client.ask(Ping()).node == "t1"
    assert client.connects == 1
    assert served.served == 20
    wait_until(lambda: not served.open_connections(), "the idle connection closed")
    with pytest.raises(AgentNotFound):  # an error reply leaves the connection usable
        client.ask(Status(5))
    assert client.ask(Stats()).connections == 1  # this request, not the kept connection
    assert client.connects == 2
    client.close()


@pytest.mark.root
def test_a_kept_connection_takes_descriptors_request_by_request(served: AgentServer) -> None:
    """Descriptors passed (SCM_RIGHTS) go with their own request and are closed once it
    is answered; more than one with a request is refused, and the connection closed
    (what follows cannot be told apart)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(str(served.agent.paths.agent_socket))
        for _ in range(3):
            r, w = os.pipe()
            socket.send_fds(s, [encode({"op": "ping"})], [w])
            os.close(w)
            assert json.loads(read_line(s))["ok"]
            # The agent closed its copy of the write end: the read end sees EOF.
            wait_until(functools.partial(readable, r), "the agent closes it")
            assert os.read(r, 1) == b""
            os.close(r)
        r, w = os.pipe()
        socket.send_fds(s, [encode({"op": "ping"})], [r, w])
        os.close(r)
        os.close(w)
        answer = json.loads(read_line(s))
        assert answer["kind"] == "invalid" and "at most 1" in answer["error"], answer
        assert s.recv(1) == b""  # closed after it
    assert served.served == 4


def readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def read_line(s: socket.socket) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(1 << 16)
        assert chunk, f"closed after {buf!r}"
        buf += chunk
    return buf


def test_a_keeping_client_asks_an_agent_of_before_once_per_connection(tmp_path: Path) -> None:
    """An agent of the previous version answers one request and closes: the keeping
    client's next request on that connection goes again on a new one, and from then on
    it opens one per request."""
    sock = tmp_path / "old.sock"
    accepted = []

    class OneShot(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            accepted.append(1)
            self.rfile.readline()
            self.wfile.write(encode({"ok": True, "node": "old", "pid": 1}))

    with socketserver.ThreadingUnixStreamServer(str(sock), OneShot) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            client = AgentClient(sock, keep=4)
            for _ in range(5):
                assert client.ask(Ping(), timeout=30).node == "old"
            assert len(accepted) == 5  # each request answered once, on its own connection
            assert client.connects == 5
        finally:
            server.shutdown()
