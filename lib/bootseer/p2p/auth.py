"""Who may fetch a job's pieces from a peer: agents that hold the job's token.

The token is an HMAC of the job id under the site key, a file only root can read, the
same on every node (``[p2p] key_file``, by default ``[site] key_file``). Every node's
agent derives it on its own; no user ever sees it, so a user (even on one of the job's
nodes) cannot ask a peer for pieces, and a node of another job cannot either. The token
never crosses the wire: a server opens each connection with a fresh nonce and every
request carries a proof, an HMAC of the nonce and the request under the token, so a user
who listens on the peer port of a node whose agent is down learns nothing she could use
elsewhere::

    >>> job_token(b"k" * 32, 42).hex()[:16]
    'd26eb31aa54afb58'
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from pathlib import Path

from bootseer.sitekey import read_key_file


@functools.lru_cache(maxsize=256)
def job_token(site_key: bytes, job_id: int) -> bytes:
    """Kept for the jobs last asked about: a server checks every request's proof with
    its job's token, and deriving it each time was an HMAC more per piece."""
    return hmac.new(site_key, b"bootseer p2p v1 job %d" % job_id, hashlib.sha256).digest()


def prove(token: bytes, nonce: bytes, job_id: int, piece: str) -> str:
    """The request's proof (hex) on a connection that opened with ``nonce``."""
    msg = b"bootseer p2p v1 %d %s " % (job_id, piece.encode()) + nonce
    return hmac.new(token, msg, hashlib.sha256).hexdigest()


def check_proof(site_key: bytes, nonce: bytes, job_id: int, piece: str, proof: str) -> bool:
    want = prove(job_token(site_key, job_id), nonce, job_id, piece)
    return hmac.compare_digest(want.encode(), proof.encode())


def load_site_key(path: Path) -> bytes:
    """The site key's current (first) line; refused unless the file is root's alone
    (:func:`bootseer.sitekey.read_key_file`)."""
    return read_key_file(path)[0]
