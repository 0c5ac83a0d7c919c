"""Dependency snapshots: capture what a job's first run installed, restore it on every node.

One module per idea:

- :mod:`~bootseer.deps.key`: the snapshot key and what goes into it
- :mod:`~bootseer.deps.layout`: where snapshots live in the store
- :mod:`~bootseer.deps.manifest`: what a snapshot holds, and its checks
- :mod:`~bootseer.deps.frames`: independent zstd frames, encoded and decoded in parallel
- :mod:`~bootseer.deps.archive`: tar writing and the hardened extraction filter
- :mod:`~bootseer.asuser`: work done with the job user's rights
- :mod:`~bootseer.deps.capture` / :mod:`~bootseer.deps.restore`: store <-> prefix
- :mod:`~bootseer.deps.nodecache`: one restore per prefix per node
- :mod:`~bootseer.deps.jobstate`: what prolog, job and epilog tell each other
- :mod:`~bootseer.deps.inventory`: what an install added
- :mod:`~bootseer.deps.run`: ``bootseer deps run``
- :mod:`~bootseer.deps.step`: the prolog/epilog steps
- :mod:`~bootseer.deps.gc`: listing and collecting snapshots

See docs/deps.md.
"""
