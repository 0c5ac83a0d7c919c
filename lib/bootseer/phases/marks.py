"""Job-side phase marks: cheap enough for a training loop.

A mark is one ``write`` of one JSON line to the node-local spool file the prolog
made for the job (``$BOOTSEER_PHASE_MARKS``); nothing here imports pyarrow. The
epilog turns the marks into phase rows, and so does a flush started in the
background when ``first_step`` ends, so a running job's startup shows in
``bootseer report`` before the job is over::

    import bootseer

    with bootseer.phase("ckpt_load"):
        model.load_state_dict(torch.load(path))
    ...
    with bootseer.phase("first_step"):
        train_step(batch)

A job that did not run with ``--bootseer`` has no spool: marks then do nothing
(and say so once on stderr). A mark never raises into the job for want of a spool.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from bootseer import nodename, nodepaths
from bootseer.errors import describe

TYPE_CHECKING = False  # typing costs a mark from a job script milliseconds
if TYPE_CHECKING:
    from typing import Literal

    from bootseer.stepapi import Outcome

    Event = Literal["start", "end"]

# Kept equal to bootseer.phases.schema and bootseer.stepapi (a test checks), not imported
# from them: a mark from a job script is a process start, and every import counts there.
PHASE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
OUTCOMES = ("ok", "failed", "skipped", "timed_out")
STARTUP_END = "first_step"
DETAIL_MAX = 500

MARKS_ENV = "BOOTSEER_PHASE_MARKS"
# Set to 0 to keep first_step from starting a background flush (the epilog still flushes).
FLUSH_ENV = "BOOTSEER_PHASE_FLUSH"
# The node agent's socket, set by the image step: first_step ends the job's block trace.
AGENT_ENV = "BOOTSEER_AGENT_SOCKET"

_fds: dict[str, int] = {}
_warned = False


def _task() -> str:
    env = os.environ
    return f"{env.get('SLURM_STEP_ID', 'batch')}.{env.get('SLURM_PROCID', '0')}"


def marks_path() -> str | None:
    """``$BOOTSEER_PHASE_MARKS`` with ``%n`` as this task's node (see phases.hooks)."""
    path = os.environ.get(MARKS_ENV)
    return nodename.expand(path, nodepaths.node_name()) if path else path


def _fd(path: str) -> int:
    fd = _fds.get(path)
    if fd is None:
        # No O_CREAT: the prolog made the file; a missing one means no spool, not a new file.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        _fds[path] = fd
    return fd


def _say_once(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        print(f"bootseer phase: {message}", file=sys.stderr)


def mark(
    event: Event,
    name: str,
    outcome: Outcome = "ok",
    detail: str = "",
    bytes: int = 0,
    when: float | None = None,
    store_bytes: int = 0,
    peer_bytes: int = 0,
) -> bool:
    """Record that phase ``name`` starts or ends now; True if the mark was recorded.

    ``event`` is ``"start"`` or ``"end"``. A bad name or outcome raises ``ValueError``
    (a bug in the caller); a missing spool returns False.

    >>> mark("start", "ckpt_load")  # doctest: +SKIP
    True
    """
    if event not in ("start", "end"):
        raise ValueError(f"event must be start or end, not {event!r}")
    if not PHASE_NAME.match(name):
        from bootseer.phases.schema import check_phase_name

        check_phase_name(name)  # raises, with the message listing the standard names
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, not {outcome!r}")
    path = marks_path()
    if not path:
        _say_once(
            f"{event} {name} not recorded: ${MARKS_ENV} is not set "
            "(did the job run with --bootseer?)"
        )
        return False
    record: dict[str, object] = {
        "ev": event,
        "phase": name,
        "t": time.time() if when is None else when,
        "task": _task(),
    }
    if outcome != "ok":
        record["outcome"] = outcome
    if detail:
        record["detail"] = detail[:DETAIL_MAX]
    if bytes:
        record["bytes"] = int(bytes)
    if store_bytes:
        record["store_bytes"] = int(store_bytes)
    if peer_bytes:
        record["peer_bytes"] = int(peer_bytes)
    line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    try:
        os.write(_fd(path), line)  # one write on O_APPEND: lines from many ranks never mix
    except OSError as exc:
        _say_once(f"{event} {name} not recorded: {path}: {exc.strerror}")
        return False
    if event == "end" and name == STARTUP_END:
        tell_agent_first_step()
        flush_in_background(path)
    return True


@contextmanager
def phase(name: str, detail: str = "") -> Iterator[None]:
    """Mark the enclosed block as phase ``name``; an exception marks it failed.

    >>> with phase("framework_init"):  # doctest: +SKIP
    ...     dist.init_process_group("nccl")
    """
    mark("start", name)
    try:
        yield
    except BaseException as exc:
        mark("end", name, outcome="failed", detail=detail or describe(exc, named=True))
        raise
    mark("end", name, detail=detail)


def tell_agent_first_step() -> None:
    """Tell the node agent the job reached its first step, so its block trace ends here.

    Best effort and brief: without an answer within half a second the trace ends with
    its time window instead. Every task may call it; the agent keeps the first.
    """
    path, job = os.environ.get(AGENT_ENV), os.environ.get("SLURM_JOB_ID", "")
    if not path or not job.isdigit():
        return
    # Here: every other mark stays free of the socket module.
    from bootseer.agentapi.client import AgentClient
    from bootseer.agentapi.errors import AgentError
    from bootseer.agentapi.jobs import FirstStep

    with contextlib.suppress(AgentError):
        AgentClient(path).ask(FirstStep(int(job)), timeout=0.5)


def flush_in_background(marks_path: str) -> None:
    """Start a detached ``python -m bootseer.phases.flush`` for the job's marks so far.

    Best effort: it needs write access to the store; if it has none, the epilog
    writes the same rows when the job ends.
    """
    if os.environ.get(FLUSH_ENV, "1") == "0":
        return
    if os.environ.get("SLURM_LOCALID", "0") != "0":
        return  # one flush per node, from its first task; the epilog has the other ranks'
    from bootseer.phases.spawn import spawn_flush

    spawn_flush("marks", os.path.dirname(marks_path))
