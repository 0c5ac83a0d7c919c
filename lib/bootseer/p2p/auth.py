"""Who may fetch a job's pieces from a peer: agents that hold the job's token.

The token is an HMAC of the job id under the site key, a file only root can read, the
same on every node (``[p2p] key_file``, by default ``[site] key_file``). Every node's
agent derives it on its own; no user ever sees it, so a user (even on one of the job's
nodes) cannot ask a peer for pieces, and a node of another job cannot either::

    >>> job_token(b"k" * 32, 42).hex()[:16]
    'd26eb31aa54afb58'
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

from bootseer.sitekey import read_key_file


def job_token(site_key: bytes, job_id: int) -> bytes:
    return hmac.new(site_key, b"bootseer p2p v1 job %d" % job_id, hashlib.sha256).digest()


def check_token(site_key: bytes, job_id: int, token_hex: str) -> bool:
    try:
        given = bytes.fromhex(token_hex)
    except ValueError:
        return False
    return hmac.compare_digest(given, job_token(site_key, job_id))


def load_site_key(path: Path) -> bytes:
    """The site key's current (first) line; refused unless the file is root's alone
    (:func:`bootseer.sitekey.read_key_file`)."""
    return read_key_file(path)[0]
