"""A root-run part's way to the job's peers for located pieces: through the node agent.

The prolog's snapshot restore and the checkpoint mount daemon read byte ranges of
store objects whose digest they know (snapshot frames, checkpoint units). Through
:func:`agent_via` each asks the node's agent, which takes the piece from its owner among
the job's nodes or, owning it, from the store, and keeps it in its cache. The agent
passes the cache's pack that holds it, opened, with its reply, where the piece lies in it
and the CRCs it recorded when it verified the piece: the caller reads the piece's range
and checks the CRCs (0.26 CPU-s per GiB here), not the digest again (BLAKE3 0.12,
SHA-256 0.6), and the agent reads nothing. Asked without the file (or an agent from
before, whose cache file was the piece's alone: ``offset`` None), the caller reads the
file by its name and checks the digest. ``None`` from the function means: read it from
the store yourself (no agent, an error, a one-node job unless asked for, an agent of a
release before BLAKE3, which refuses the request)::

    >>> via = agent_via(cfg, job_id=42, nodes=("n1", "n2"), log=print)  # doctest: +SKIP
    >>> via("", "deps/user/abc/data-1.tar.zst", 0, 262144, digest)  # doctest: +SKIP
    ... # (bytes, "peer"), or None
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from bootseer import digest as digests
from bootseer.config import SiteConfig
from bootseer.context import fold_nodes
from bootseer.directio import Buffers, read_direct, read_fd
from bootseer.errors import describe
from bootseer.image.cache import crcs_match

if TYPE_CHECKING:
    from bootseer.agentapi.jobs import PieceFile

# (target URI or "" for the main store, key, offset, length, digest) -> (the bytes, where
# they came from: "peer", "store" or "cache"), or None.
Via = Callable[[str, str, int, int, str], tuple[bytes | memoryview, str] | None]
# Pieces held at once by a caller (a checkpoint reader's read-ahead and its fetches in
# flight): the buffers kept for reuse.
KEEP_BUFFERS = 32
# Connections to the agent kept open for the next pieces (one per fetch in flight: a
# checkpoint reader's ``max_inflight``, 8 by default), not one made per piece.
KEEP_CONNECTIONS = 16


def agent_via(
    cfg: SiteConfig,
    job_id: int,
    nodes: Sequence[str],
    log: Callable[[str], None],
    timeout: float = 30.0,
    owner: tuple[int, str] | None = None,
    one_node: bool = False,
) -> Via | None:
    """None with p2p off, and for a one-node job (nothing to share) unless ``one_node``:
    then the agent reads the store itself and keeps what it read in the node's cache,
    where a warm-up puts what the job reads later (:mod:`bootseer.ckpt.warm`). ``owner``:
    the job's uid and account (the prolog's Slurm environment), told to the agent with
    each ask."""
    if not cfg.p2p.enabled or (len(nodes) < 2 and not one_node):
        return None
    from bootseer.agentapi.client import AgentClient
    from bootseer.agentapi.errors import AgentError, AgentRefused, AgentUnavailable
    from bootseer.agentapi.jobs import FetchPiece
    from bootseer.nodepaths import NodePaths

    socket = NodePaths(cfg).agent_socket
    client = AgentClient(socket, keep=KEEP_CONNECTIONS)
    # Folded (``n[0001-9999]``): a request per piece carries it, and the names one by
    # one passed the agent's 64 KiB request line at ~6,000 nodes.
    # No node list for a job on one node: the agent asks no peer, only the store.
    nodelist = fold_nodes(nodes) if len(nodes) > 1 else ""
    broken = False
    buffers = Buffers(KEEP_BUFFERS)
    uid, account = owner if owner is not None else (-1, "")

    def via(
        target: str, key: str, offset: int, length: int, digest: str, pass_file: bool = True
    ) -> tuple[bytes | memoryview, str] | None:
        nonlocal broken
        if broken:
            return None
        req = FetchPiece(
            job_id,
            nodelist,
            key,
            offset,
            length,
            digest,
            target=target,
            uid=uid,
            account=account,
            pass_file=pass_file,
        )
        try:
            piece, fds = client.ask_for_fds(req, timeout=timeout)
            try:
                if piece.passed and fds:
                    data = read_fd(fds[0], buffers, piece.offset or 0, _size(piece, length))
                    buffers.retire(data)
                    if len(data) == length and crcs_match(piece.crcs, data):
                        return data, piece.source
                    # Damaged on the agent's disk: ask again without the file, and the
                    # agent's own read drops the block and fetches it again.
                    log(f"{key} at {offset}: the agent's cache file is damaged; asked again")
                    return via(target, key, offset, length, digest, pass_file=False)
            finally:
                for fd in fds:
                    os.close(fd)
            # Asked without the file, or an agent from before passed files: the piece's
            # range of the file named, read past the page cache as it was written, into a
            # buffer used again once the caller drops it.
            data = read_direct(piece.path, buffers, piece.offset or 0, _size(piece, length))
            buffers.retire(data)
        except (AgentUnavailable, AgentRefused) as exc:
            # No agent, or not root: the store for every piece, without asking again.
            broken = isinstance(exc, AgentRefused) or not os.path.exists(socket)
            log(f"{key} at {offset} from the store: {exc}")
            return None
        except (AgentError, OSError) as exc:
            log(f"{key} at {offset} from the store: {describe(exc)}")
            return None
        # The cache file may have changed since the agent checked it: check again.
        if len(data) != length or not digests.matches(data, digest):
            return None
        return data, piece.source

    return via


def _size(piece: PieceFile, length: int) -> int | None:
    """The bytes to read of the agent's file: the piece's, or (an agent from before,
    whose file was the piece's alone) the whole file."""
    return None if piece.offset is None else length
