"""Root acts on the checkpoint targets itself; a user goes through the node agent.

One interface, :class:`CkptAccess`, two ways to it, chosen once by the caller's euid
(:func:`access`): :class:`Direct` (root: the store credentials and the site key are
hers; :mod:`bootseer.ckpt.actions` on the namespace) and :class:`ThroughAgent` (a user,
who holds neither: the agent's checkpoint door does the same actions in her own
namespaces, :mod:`bootseer.ckpt.door`). The CLI has one code path per action.

    >>> access(load_config()).ls("llama-25b", "step100")  # doctest: +SKIP
    CkptListReply(entries=[CkptEntry(name='model.pt', is_dir=False, ...)], left_out=0)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from typing import TYPE_CHECKING, Protocol

from bootseer.agentapi.ckpt import (
    CkptGet,
    CkptGetReply,
    CkptList,
    CkptListReply,
    CkptPut,
    CkptPutReply,
    CkptRemove,
    CkptRemoveReply,
    CkptUsage,
    CkptUsageReply,
    CkptVerify,
    CkptVerifyReply,
)
from bootseer.ckpt import actions
from bootseer.errors import BootseerError

if TYPE_CHECKING:
    from bootseer.agentapi.client import AgentClient
    from bootseer.ckpt.namespace import Namespace
    from bootseer.config import SiteConfig


class CkptAccess(Protocol):
    """The checkpoint actions a ``bootseer ckpt`` caller may take, in ``user``'s
    namespaces. ``fd``: the caller's file (a ``put`` reads it, a ``get`` writes it)."""

    user: str

    def put(self, ns: str, path: str, fd: int) -> CkptPutReply: ...
    def get(self, ns: str, path: str, fd: int) -> CkptGetReply: ...
    def ls(self, ns: str, path: str) -> CkptListReply: ...
    def rm(self, ns: str, paths: tuple[str, ...]) -> CkptRemoveReply: ...
    def verify(self, ns: str, path: str, tick: actions.Tick | None = None) -> CkptVerifyReply: ...
    def usage(self) -> CkptUsageReply: ...


def access(cfg: SiteConfig, user: str | None = None) -> CkptAccess:
    """Root's own access (as ``user``, default root's own name), or a user's through the
    node agent (in her own namespaces: she names no user)."""
    import pwd

    me = pwd.getpwuid(os.getuid()).pw_name
    if os.geteuid() == 0:
        return Direct(cfg, user or me)
    if user is not None:
        raise BootseerError("--user is for root only")
    from bootseer.agentapi.client import node_agent

    return ThroughAgent(node_agent(cfg), me)


class Direct:
    """Root's: the actions on the targets, sealed and checked with the site key."""

    def __init__(self, cfg: SiteConfig, user: str) -> None:
        self.cfg, self.user = cfg, user

    def namespace(self, ns: str) -> Namespace:
        from bootseer.ckpt.names import namespace_name
        from bootseer.ckpt.namespace import Namespace
        from bootseer.sitekey import keys_if_root

        name = namespace_name(self.user, ns)
        return Namespace.from_config(self.cfg, name, keys=keys_if_root(self.cfg))

    def put(self, ns: str, path: str, fd: int) -> CkptPutReply:
        return actions.put(self.namespace(ns), path, fd)

    def get(self, ns: str, path: str, fd: int) -> CkptGetReply:
        return actions.get(self.namespace(ns), path, fd)

    def ls(self, ns: str, path: str) -> CkptListReply:
        return actions.ls(self.namespace(ns), path)

    def rm(self, ns: str, paths: tuple[str, ...]) -> CkptRemoveReply:
        return actions.rm(self.namespace(ns), paths)

    def verify(self, ns: str, path: str, tick: actions.Tick | None = None) -> CkptVerifyReply:
        return actions.verify(self.namespace(ns), path, tick=tick)

    def usage(self) -> CkptUsageReply:
        return actions.usage(self.cfg, self.user)


class ThroughAgent:
    """A user's: each action a request to the node agent's checkpoint door."""

    def __init__(self, client: AgentClient, user: str) -> None:
        self.client, self.user = client, user

    def put(self, ns: str, path: str, fd: int) -> CkptPutReply:
        return self.client.ask(CkptPut(ns, path), fds=[fd])

    def get(self, ns: str, path: str, fd: int) -> CkptGetReply:
        """The agent (root) writes the checkpoint into a pipe; this process, the user's,
        copies it into ``fd``: the user's disk quota holds, and so does the reserve a
        filesystem keeps for root (the agent refuses to write a user's file itself)."""
        r, w = os.pipe()
        with contextlib.suppress(OSError):
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
        failed: list[OSError] = []

        def copy() -> None:
            try:
                while chunk := os.read(r, 1 << 20):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view) :]
            except OSError as exc:
                failed.append(exc)
            finally:
                os.close(r)  # the agent's next write then fails (EPIPE) and it gives up

        t = threading.Thread(target=copy, daemon=True)
        t.start()
        reply: CkptGetReply | None = None
        try:
            try:
                reply = self.client.ask(CkptGet(ns, path), fds=[w])
            finally:
                os.close(w)
                t.join()
        except BootseerError:
            if not failed:
                raise
        if failed or reply is None:
            raise BootseerError(f"writing the output: {failed[0].strerror or failed[0]}")
        return reply

    def ls(self, ns: str, path: str) -> CkptListReply:
        return self.client.ask(CkptList(ns, path))

    def rm(self, ns: str, paths: tuple[str, ...]) -> CkptRemoveReply:
        return self.client.ask(CkptRemove(ns, paths))

    def verify(self, ns: str, path: str, tick: actions.Tick | None = None) -> CkptVerifyReply:
        return self.client.ask(CkptVerify(ns, path))

    def usage(self) -> CkptUsageReply:
        return self.client.ask(CkptUsage())
