"""The image steps of the Prolog and Epilog.

Prolog: ask the node agent to prepare the job's image (register a path image on
first use, load its trace, prefetch the hot set, start the background fill) and hand
the job the lazy file in the agent's FUSE mount as ``BOOTSEER_IMAGE``.

Without an agent (not installed, not running) a path image falls back to what a job
without bootseer gets: ``BOOTSEER_IMAGE`` is the original file, checked to be a
squashfs the user may read. A registered ``NAME[:TAG]`` has no such fallback and
the step fails with a message saying so (the job starts without ``BOOTSEER_IMAGE``).
The same fallback applies when another node is still registering a path image.

Epilog: the agent saves or merges the job's trace, releases the image, and reports
the background fill, which the step returns as a row of its own, the
``image_background_fill`` phase.
"""

from __future__ import annotations

import time

from bootseer.agentapi.client import AgentClient
from bootseer.agentapi.errors import AgentError, AgentPending, AgentTimeout, AgentUnavailable
from bootseer.agentapi.jobs import (
    ByteCounts,
    FillSummary,
    JobReply,
    PrefetchSummary,
    Prepare,
    Release,
)
from bootseer.context import fold_nodes
from bootseer.errors import StepError, StoreError
from bootseer.image.registry import check_image_file
from bootseer.nodepaths import NodePaths
from bootseer.stepapi import Outcome, StepCall, StepResult, StepRow

MARGIN = 1.0  # seconds left to the runner after the agent's answer
# The agent cannot serve the image in time, but the job may still read a path image
# directly: no agent, another node still registering the image, no answer in time.
FALL_BACK = (AgentUnavailable, AgentPending, AgentTimeout)


def _fallback(call: StepCall, image: str, why: str) -> StepResult:
    if not image.startswith("/"):
        raise StepError(f"registered image {image!r}: {why}; there is nothing to fall back to")
    try:
        st = check_image_file(image, call.ctx.uid, call.ctx.gid)
    except StoreError as exc:
        raise StepError(str(exc)) from None
    call.log(f"step=image {why}: the job reads {image} directly")
    return StepResult(
        detail=f"fallback=direct reason={why!r} image={image} size={st.st_size}",
        env={"BOOTSEER_IMAGE": image, "BOOTSEER_IMAGE_REF": image},
    )


def prolog(call: StepCall) -> StepResult:
    image = call.ctx.options.image
    assert image is not None
    client = AgentClient(NodePaths(call.cfg).agent_socket)
    wait = call.remaining() - MARGIN
    if wait <= 1:
        return _fallback(call, image, "no time left for the agent")
    request = Prepare(
        call.ctx.job_id,
        call.ctx.uid,
        call.ctx.gid,
        image,
        mode="refresh" if call.ctx.options.mode == "refresh" else "on",
        deadline=wait - MARGIN,
        nodelist=fold_nodes(call.ctx.nodes),  # 10,000 names one by one pass 64 KiB
    )
    try:
        resp = client.ask(request, timeout=wait)
    except FALL_BACK as exc:
        return _fallback(call, image, str(exc))
    except AgentError as exc:
        raise StepError(str(exc)) from None
    p = resp.prefetch or PrefetchSummary()
    fetched = p.fetched_bytes
    # Where the prefetch's bytes came from: the swarm's counts by the prolog's return, or
    # without peers all from the origin (the store, or the image file on shared storage).
    store, peer = _counts(resp.peers.at_prepare) if resp.peers else (fetched, 0)
    detail = (
        f"image={resp.image[:12]} size={resp.size} hot_blocks={p.hot_blocks} "
        f"hot_bytes={p.hot_bytes} local_blocks={p.local_before} "
        f"fetched_blocks={p.fetched_blocks} hit_ratio={p.hit_ratio} complete={p.complete} "
        f"trace_runs={resp.trace_runs}"
    )
    env = {
        "BOOTSEER_IMAGE": resp.path,  # this job's lazy file
        "BOOTSEER_IMAGE_REF": image,  # what the job asked for (the same in every run)
        "BOOTSEER_AGENT_SOCKET": str(NodePaths(call.cfg).agent_socket),
    }
    return StepResult(detail=detail, bytes=fetched, store_bytes=store, peer_bytes=peer, env=env)


def _counts(counts: ByteCounts | None) -> tuple[int, int]:
    """(store bytes, peer bytes) of the agent's peer stats: the job's whole life, or one
    snapshot of it (``at_prepare``, ``at_fill``); (0, 0) where it has none."""
    if counts is None:
        return 0, 0
    return _int(counts.store_bytes), _int(counts.peer_bytes)


def _int(v: object) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def epilog(call: StepCall) -> StepResult:
    client = AgentClient(NodePaths(call.cfg).agent_socket)
    try:
        resp = client.ask(Release(call.ctx.job_id), timeout=max(1.0, call.remaining() - MARGIN))
    except AgentUnavailable:
        return StepResult(outcome="skipped", detail="no node agent: no trace to save")
    except AgentError as exc:
        raise StepError(str(exc)) from None
    if not resp.released or resp.job is None:
        return StepResult(outcome="skipped", detail="the agent had no image for this job")
    job = resp.job
    fill = job.fill
    # The job's image bytes on this node split three ways: the prefetch (the prolog's
    # image_prefetch row), the background fill (image_background_fill, from the fill's
    # start to now), and between the two the job's own reads during startup (this row).
    fill_store, fill_peer, reads_store, reads_peer = _split(job)
    fill_row = background_fill_row(fill, fill_store, fill_peer)
    peers = job.peers
    failures = f" peer_failures={peers.peer_failures} corrupt={peers.corrupt}" if peers else ""
    return StepResult(
        detail=(
            f"trace={resp.trace} recorded_blocks={job.recorded_blocks} "
            f"fetched_before_first_step={job.fetched_before_first_step} "
            f"fill_state={fill.state if fill else None} "
            f"fill_blocks={fill.done if fill else None}/{fill.blocks if fill else None}{failures}"
        ),  # the fill's bytes go to its own phase row, image_background_fill
        bytes=reads_store + reads_peer,
        store_bytes=reads_store,
        peer_bytes=reads_peer,
        rows=[fill_row] if fill_row else [],
    )


def _split(job: JobReply) -> tuple[int, int, int, int]:
    """(fill store, fill peer, reads store, reads peer): the fill's bytes from the store
    and from peers, and the job's reads between the prolog's return and the fill's start."""
    fill_bytes = _int(job.fill.bytes) if job.fill else 0
    if not job.peers:  # every byte from the origin
        prefetched = _int(job.prefetch.fetched_bytes) if job.prefetch else 0
        reads = max(0, _int(job.fetched_before_first_step) - prefetched)
        return fill_bytes, 0, reads, 0
    total_store, total_peer = _counts(job.peers)
    prep_store, prep_peer = _counts(job.peers.at_prepare)
    if job.peers.at_fill is not None:
        at_store, at_peer = _counts(job.peers.at_fill)
    else:  # no fill (yet): everything after the prolog was the job's reads
        at_store, at_peer = total_store, total_peer
    return (
        max(0, total_store - at_store),
        max(0, total_peer - at_peer),
        max(0, at_store - prep_store),
        max(0, at_peer - prep_peer),
    )


def background_fill_row(
    fill: FillSummary | None, store_bytes: int = 0, peer_bytes: int = 0
) -> StepRow | None:
    """The ``image_background_fill`` phase row; None where no fill started.

    The fill runs in the agent after the prolog returned, so no hook step spans it;
    the epilog learns its start, end and bytes (and how many of them came from the
    store and from peers) from the agent. A fill still running when the job ends is
    cut off there (outcome ``skipped``, end = now); one that ended is ``ok``, or
    ``failed`` when blocks could not be fetched.
    """
    if fill is None or fill.start is None:
        return None
    failed = _int(fill.failed)
    state = fill.state
    outcome: Outcome = "skipped" if state != "done" else ("failed" if failed else "ok")
    return StepRow(
        "image_background_fill",
        fill.start,
        fill.end if fill.end is not None else time.time(),
        outcome,
        _int(fill.bytes),
        f"state={state} blocks={fill.done}/{fill.blocks} failed={failed}",
        store_bytes=store_bytes,
        peer_bytes=peer_bytes,
    )
