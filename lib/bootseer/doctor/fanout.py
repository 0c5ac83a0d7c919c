"""``bootseer doctor NODESET``: each node's checks, asked over ssh, many at once."""

from __future__ import annotations

from dataclasses import dataclass

from bootseer.choices import one_of
from bootseer.doctor.result import STATUSES, Check, Status

RSH = "ssh -o BatchMode=yes -o ConnectTimeout=10"


@dataclass(frozen=True)
class NodeAnswer:
    """One node's checks from ``bootseer doctor --json`` run there, or why there are none."""

    node: str
    checks: tuple[Check, ...] = ()
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and all(c.ok for c in self.checks)

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {"ok": self.ok, "checks": [c.to_json() for c in self.checks]}
        if self.error:
            doc["error"] = self.error
        return doc


def ask_node(node: str, rsh: str, bootseer: str, timeout: float = 120.0) -> NodeAnswer:
    """Run ``bootseer doctor --json`` on ``node`` through ``rsh`` (ssh's way: the node,
    then one command line for its shell)."""
    import json
    import shlex
    import subprocess

    remote = shlex.join([bootseer, "doctor", "--json", "--node", node])
    try:
        r = subprocess.run(
            [*shlex.split(rsh), node, remote],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return NodeAnswer(node, error=f"no answer within {timeout:g}s")
    except OSError as exc:
        return NodeAnswer(node, error=f"{rsh.split()[0]}: {exc.strerror}")
    try:
        doc = json.loads(r.stdout)
        checks = tuple(
            Check(str(c["name"]), _status(c["status"]), str(c["detail"]), str(c.get("fix", "")))
            for c in doc["checks"]
        )
    except (ValueError, KeyError, TypeError):
        said = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
        return NodeAnswer(node, error=said)
    return NodeAnswer(node, checks)


def _status(value: object) -> Status:
    status = one_of(value, STATUSES)
    if status is None:
        raise ValueError(f"unknown check status {str(value)[:40]!r}")
    return status


def ask_nodes(
    nodes: list[str], rsh: str = RSH, bootseer: str = "bootseer", fanout: int = 32
) -> list[NodeAnswer]:
    """Every node's answer, ``fanout`` at a time, in the order of ``nodes``."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(fanout, len(nodes)))) as pool:
        return list(pool.map(lambda n: ask_node(n, rsh, bootseer), nodes))
