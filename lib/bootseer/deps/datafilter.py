"""tarfile's ``data`` extraction filter (PEP 706), on every Python 3.11.

Python 3.11.4 added the filter; Debian bookworm's own interpreter is 3.11.2, whose
``TarFile.extract`` takes no ``filter=`` and whose tarfile has no ``data_filter``.
Where the interpreter has it, :func:`data_filter` *is* tarfile's; elsewhere it is a
copy of the same rules (CPython's ``_get_filtered_attrs`` with ``for_data=True``):

- a leading ``/`` is stripped, and a name that still resolves outside ``dest`` is refused;
- a link (symbolic or hard) must not be absolute and must resolve inside ``dest``;
- device nodes, FIFOs and other special files are refused;
- modes lose setuid, setgid, sticky and group/other write; a file its owner cannot
  execute loses every execute bit and its owner may always read and write it;
  directories and symlinks keep no mode of the archive's (the process's umask decides);
- owner and group ids and names are dropped (the extracting user owns what it writes).

:func:`extract` extracts one member through a filter on either kind of interpreter:
on 3.11.2 it calls the filter itself and extracts the member it returned, with the
archive's modes and ids replaced as above.

    >>> import tarfile
    >>> m = tarfile.TarInfo("bin/tool"); m.mode = 0o4777
    >>> oct(data_filter(m, "/tmp/x").mode)
    '0o755'
"""

from __future__ import annotations

import copy
import os
import tarfile
from collections.abc import Callable
from typing import Any

NATIVE = hasattr(tarfile, "data_filter")
"""Whether this interpreter's tarfile has PEP 706's filters (tests turn it off)."""

Filter = Callable[[tarfile.TarInfo, str], tarfile.TarInfo]


class FilterError(tarfile.TarError):
    """A member the ``data`` filter refuses (tarfile.FilterError where it exists)."""


def replace(member: tarfile.TarInfo, **attrs: Any) -> tarfile.TarInfo:
    """A shallow copy of ``member`` with ``attrs`` changed (``TarInfo.replace`` of 3.11.4)."""
    new = copy.copy(member)
    for k, v in attrs.items():
        setattr(new, k, v)
    return new


def data_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """``member`` as the ``data`` filter lets it through, or :class:`FilterError`."""
    if NATIVE:
        try:
            return tarfile.data_filter(member, dest)  # type: ignore[attr-defined,no-any-return]
        except tarfile.FilterError as exc:  # type: ignore[attr-defined]
            raise FilterError(str(exc)) from None
    return replace(member, **_filtered_attrs(member, dest))


def filtered_mode(member: tarfile.TarInfo) -> int | None:
    """The mode the ``data`` filter gives ``member``: a file's without setuid, setgid,
    sticky or group/other write, readable and writable by its owner, executable by
    none unless by its owner; None for a directory or symlink (the umask decides);
    :class:`FilterError` for anything else (devices, FIFOs).

    >>> m = tarfile.TarInfo("f"); m.mode = 0o6777
    >>> oct(filtered_mode(m))
    '0o755'
    """
    if member.isreg() or member.islnk():
        mode = member.mode & 0o755
        if not mode & 0o100:
            mode &= ~0o111
        return mode | 0o600
    if member.isdir() or member.issym():
        return None
    raise FilterError(f"{member.name!r} is a special file")


def _outside(path: str, dest: str) -> bool:
    return os.path.commonpath([path, dest]) != dest


def _filtered_attrs(member: tarfile.TarInfo, dest_path: str) -> dict[str, Any]:
    new: dict[str, Any] = {}
    name = member.name
    dest_path = os.path.realpath(dest_path)
    if name.startswith("/"):
        name = new["name"] = member.path.lstrip("/")
    if os.path.isabs(name):
        raise FilterError(f"member {member.name!r} has an absolute path")
    target = os.path.realpath(os.path.join(dest_path, name))
    if _outside(target, dest_path):
        raise FilterError(f"{member.name!r} would be extracted to {target!r}, outside {dest_path}")
    mode: int | None = member.mode
    if mode is not None:
        mode = filtered_mode(member)
        if mode != member.mode:
            new["mode"] = mode
    new.update(uid=None, gid=None, uname=None, gname=None)
    if member.islnk() or member.issym():
        if os.path.isabs(member.linkname):
            raise FilterError(f"{member.name!r} is a link to an absolute path")
        if member.issym():
            link = os.path.join(dest_path, os.path.dirname(name), member.linkname)
        else:
            link = os.path.join(dest_path, member.linkname)
        link = os.path.realpath(link)
        if _outside(link, dest_path):
            raise FilterError(f"{member.name!r} would link to {link!r}, outside {dest_path}")
    return new


def extract(tf: tarfile.TarFile, member: tarfile.TarInfo, dest: str, flt: Filter) -> None:
    """Extract ``member`` into ``dest`` through ``flt`` (which builds on :func:`data_filter`)."""
    if NATIVE:
        tf.extract(member, dest, filter=flt)  # type: ignore[call-arg]
        return
    got = flt(member, dest)
    # 3.11.2 applies every attribute it finds: none may stay None. What the filter
    # dropped (ids, directory modes) becomes what an extracting user gets anyway.
    umask = os.umask(0)
    os.umask(umask)
    if got.mode is None:
        got = replace(got, mode=0o777 & ~umask if got.isdir() else 0o644)
    got = replace(got, uid=os.getuid(), gid=os.getgid(), uname="", gname="")
    tf.extract(got, dest, set_attrs=True, numeric_owner=True)
