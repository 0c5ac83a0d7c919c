"""What ``%n`` in a configured path stands for: the node's name, as in slurm.conf.

Its own module, below both the site config (which expands it, ``SiteConfig.for_node``)
and the node-local paths (:mod:`bootseer.nodepaths`), and importing nothing: a job's
phase mark uses it.

    >>> expand("/var/tmp/dev/nodes/%n/run", "n1")
    '/var/tmp/dev/nodes/n1/run'
"""

from __future__ import annotations

NODE = "%n"


def expand(template: str, node: str) -> str:
    """``template`` with every ``%n`` replaced by ``node``."""
    return template.replace(NODE, node)
