"""The node agent's main loop: what ``bootseer agent`` runs until SIGTERM.

It brings back the jobs prepared before a restart, mounts the image filesystem
(:mod:`bootseer.agent.fuse`), answers on the socket (:mod:`bootseer.agent.server`)
in a thread of its own, and on SIGTERM/SIGINT unmounts, removes the socket and stops
the fetcher. A new listener (a peer server for other nodes) starts and stops here.
Asked to restart in place (:mod:`bootseer.agent.handover`), it cleans up the same way
but keeps its listening socket and returns it, for the program to run again.

    >>> serve(load_config().for_node("n1"), "n1")  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from collections.abc import Callable

import pyfuse3
import trio

from bootseer.agent.assembly import Agent
from bootseer.agent.fuse import MOUNT_OPTIONS, READ_AHEAD_KIB, ImageFS
from bootseer.agent.handover import Handover, inherited
from bootseer.agent.metrics import AgentMetrics
from bootseer.agent.server import AgentServer
from bootseer.config import SiteConfig
from bootseer.mounts import raise_read_ahead_when_ready, unmount_stale


def serve(
    cfg: SiteConfig,
    node: str,
    log: Callable[[str], None] | None = None,
    ready: Callable[[], None] | None = None,
) -> socket.socket | None:
    """Run the agent until SIGTERM/SIGINT: the FUSE mount and the socket, then clean up.
    Returns the listening socket when the agent is to run again in place, else None."""
    agent = Agent(cfg, node, log)
    agent.jobs.restore()
    paths = agent.paths
    mountpoint = str(paths.image_mounts)
    # First: a dead agent's mount (kill -9, OOM) makes makedirs fail with FileExistsError
    # (stat says ENOTCONN, so it is not seen as the directory it is).
    unmount_stale(mountpoint)
    os.makedirs(mountpoint, mode=0o755, exist_ok=True)
    pyfuse3.init(ImageFS(agent), mountpoint, set(MOUNT_OPTIONS))
    server: AgentServer | None = None
    metrics: AgentMetrics | None = None
    handover: Handover | None = None
    try:
        server = AgentServer(
            paths.agent_socket,
            agent,
            cfg.image.max_connections,
            cfg.image.max_connections_per_user,
            listen=inherited(paths.agent_socket),
        )
        handover = agent.handover = Handover(agent, server, paths.run_dir / "jobs")
        agent.open_connections = server.connections
        threading.Thread(target=server.serve_forever, name="agent-socket", daemon=True).start()
        threading.Thread(
            target=raise_read_ahead_when_ready, args=(mountpoint, READ_AHEAD_KIB), daemon=True
        ).start()
        agent.log(
            f"agent up: node={node} socket={paths.agent_socket} mount={mountpoint} "
            f"cache={paths.image_cache} ({agent.cache.bytes} bytes cached) "
            f"store={agent.store.uri}"
        )
        metrics = AgentMetrics.start(cfg, agent, server)
        agent.sweeper.start()  # what epilogs left of jobs Slurm no longer runs here
        if ready:
            ready()
        trio.run(_main, cfg.image.prefetch_parallel, handover)
    finally:
        again = handover is not None and handover.going
        if handover is not None:
            handover.close()
        if metrics is not None:
            # First: bootseer_agent_up 0, whatever the rest of this does (not for a
            # restart in place: the new program writes the file within a second).
            metrics.stop(last=not again)
        if server is not None and not again:
            server.shutdown()
            server.server_close()
            with contextlib.suppress(FileNotFoundError):
                paths.agent_socket.unlink()
        pyfuse3.close(unmount=True)
        agent.close()
        if again and handover is not None:
            handover.replied()
        agent.log("agent stopped: restarting in place" if again else "agent stopped")
    return server.socket if again and server is not None else None


async def _main(parallel: int, handover: Handover | None = None) -> None:
    async with trio.open_nursery() as nursery:
        if handover is not None:
            token, scope = trio.lowlevel.current_trio_token(), nursery.cancel_scope
            handover.on_stop(lambda: trio.from_thread.run_sync(scope.cancel, trio_token=token))
        nursery.start_soon(pyfuse3.main, 4, max(64, 4 * parallel))
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break
