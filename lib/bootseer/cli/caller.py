"""Who runs a command: the user name of the real uid (never ``$USER``/``$LOGNAME``, which
are the caller's to set), and the refusal of an admin action to anyone but root.

    >>> user_name() == pwd.getpwuid(os.getuid()).pw_name
    True
"""

from __future__ import annotations

import os
import pwd
from typing import TYPE_CHECKING

from bootseer.errors import BootseerError

if TYPE_CHECKING:
    from bootseer.agentapi.client import AgentClient


def user_name() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def require_root(action: str, why: str) -> None:
    """Refuse ``action`` in one line unless root runs it (users hold no store credentials)."""
    if os.geteuid() != 0:
        raise BootseerError(f"{action} is an admin action ({why}): run it as root")


def through_agent_hint(
    command: str, why: str, cause: BaseException, example: str = ""
) -> BootseerError:
    """The error for a user's ``bootseer {command}`` that found no node agent: the agent
    does it for her (``why``: what she may not do herself), so where to run it instead
    (``example``: the command as she would type it there, default ``command``).

    >>> print(through_agent_hint("image ls", "users cannot read the image records",
    ...                          OSError("no node agent on /run/bootseer/agent.sock")))
    ... # doctest: +NORMALIZE_WHITESPACE
    no node agent on /run/bootseer/agent.sock; as a user, `bootseer image ls` asks the
    node agent (users cannot read the image records): run it on a node where the agent
    runs (srun bootseer image ls), or as root
    """
    return BootseerError(
        f"{cause}; as a user, `bootseer {command}` asks the node agent ({why}): run it on "
        f"a node where the agent runs (srun bootseer {example or command}), or as root"
    )


def this_nodes_agent() -> AgentClient:
    """The client of the agent of the node this command runs on."""
    from bootseer.agentapi.client import node_agent
    from bootseer.config import load_config
    from bootseer.nodepaths import node_name

    return node_agent(load_config().for_node(node_name()))
