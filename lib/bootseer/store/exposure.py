"""What a process without store credentials reaches: the public tops, nothing else.

Users hold no store credentials; their processes open the store anonymously (S3) or
with their own file rights (``file://``). They may read and list the public tops
(``phases/``, for ``bootseer report``), never a user's snapshots, image blocks or
records, nor write anything (docs/security.md). Whether that holds is the store's
configuration (S3 identities or bucket policy, directory modes), which ``bootseer
doctor`` checks with :func:`exposure`::

    >>> exposure(open_store("file:///tmp/doc-exposure"))  # doctest: +SKIP
    []
"""

from __future__ import annotations

import contextlib
import os
import stat
import uuid

from bootseer.errors import StoreError
from bootseer.store._store import PUBLIC_TOP, TMP_PREFIX, Store, open_store

# Tops a user must not list or read (the public ones, PUBLIC_TOP, aside); "" is the
# store's root (a file:// store's root stays traversable: ``report`` reads phases/).
PRIVATE_TOPS = ("", "deps", "images")


def exposure(store: Store) -> list[str]:
    """What anyone without credentials can do beyond the public tops; [] if nothing.

    ``store`` is the configured one (with credentials, for root): on S3 the probes run
    as the anonymous identity (and the admin cleans up after a write that got through);
    on a ``file://`` store they read the directories' modes."""
    if store.is_local:
        return _local(store)
    return _anonymous_s3(store)


def _private_tops(store: Store) -> list[str]:
    """PRIVATE_TOPS, and the public tops the site keeps private ([store] public_phases)."""
    return [*PRIVATE_TOPS, *sorted(PUBLIC_TOP - store.public_tops)]


def _anonymous_s3(admin: Store) -> list[str]:
    anon = open_store(admin.uri)
    found = []
    for top in _private_tops(admin):
        try:
            anon.list(top)
        except StoreError:
            continue  # refused (or unanswered: the store check says which)
        found.append(f"anonymous listing of {top + '/' if top else 'the store root'} answered")
    probe = f"{TMP_PREFIX}doctor-anonymous-{uuid.uuid4().hex[:12]}"
    try:
        anon.write_bytes(probe, b"", atomic=False)
    except StoreError:
        pass
    else:
        found.append("an anonymous write was accepted")
        for who in (anon, admin):
            with contextlib.suppress(StoreError, OSError):
                who.delete(probe)
    return found


def _local(store: Store) -> list[str]:
    found = []
    for top in _private_tops(store):
        path = os.path.join(store.root, top) if top else store.root
        try:
            st = os.stat(path)
        except OSError:
            continue
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o002:
            found.append(f"{path} is writable by every user (mode {mode:04o})")
        elif top and mode & 0o005:
            found.append(f"{path} is open to every user (mode {mode:04o})")
    return found
