"""Peer-to-peer among a job's nodes: each piece leaves the store once per job.

A piece (an image block, a snapshot frame, a checkpoint unit) is named by its digest
(:mod:`bootseer.digest`: BLAKE3, or SHA-256 for what was stored before).
For every piece one node of the job is its *owner* (:mod:`.owner`): the owner fetches it
from the store; every other node of the job asks the owner's agent for it over TCP
(:mod:`.server`, :mod:`.client`), verifies the digest, and falls back to the store when
the owner is dead, slow or serves bad bytes (:mod:`.swarm`). Peers serve a job's pieces
only to agents that prove they belong to that job, with a per-job token derived from a
site key only root holds on the nodes (:mod:`.auth`). The bytes on the wire are the one
typed contract in :mod:`.wire`. docs/p2p.md has the design and its measurements.
"""
