"""``bootseer install NODESET``: one self-contained install per node, built once, copied over SSH.

The admin machine builds once (:mod:`~bootseer.install.bundle`: the wheels of bootseer
and its dependencies, the SPANK plugin, the hooks, the agent's unit); each node gets a
copy over SSH (:mod:`~bootseer.install.remote`, paramiko) and builds its venv from those
wheels alone on its own Python (no compiler, no PyPI on compute nodes). What a node
holds afterwards is :mod:`~bootseer.install.layout`'s; what one node's install does is
:mod:`~bootseer.install.node`'s (idempotent: a second run changes nothing); many nodes
at once and the folded summary are :mod:`~bootseer.install.fanout`'s. slurm.conf is
never rewritten: :mod:`~bootseer.install.slurmconf` prints the lines to add, for the
hosts the run prepared (a compute node gets everything, a submit or login host, the
client role, the plugin, the CLI and the config). :mod:`~bootseer.install.uninstall`
takes an install back once Slurm no longer names it.
"""

from __future__ import annotations
