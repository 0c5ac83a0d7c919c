"""The kernel's mount table and the FUSE plumbing both mounts need (images, checkpoints).

Read the table (:func:`mount_device`, :func:`is_mounted`) without touching the mount
itself: ``stat`` on a mount whose daemon died hangs or fails with ENOTCONN. Unmount with
``umount2`` (:func:`umount`; both callers run as root), clear what a crashed daemon left
behind (:func:`unmount_stale`), and raise the kernel's read-ahead for a FUSE mount
(:func:`set_read_ahead`, :func:`raise_read_ahead_when_ready`).

    >>> is_mounted("/proc")
    True
    >>> unescape("/run/my\\\\040dir")
    '/run/my dir'
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import time
from pathlib import Path

MNT_DETACH = 2
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8


def unescape(field: str) -> str:
    """A path as the kernel writes it in /proc/*/mountinfo (space, tab, newline, backslash)."""
    return (
        field.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
    )


def mount_device(path: str | Path) -> str | None:
    """``major:minor`` of what is mounted at ``path`` (the top one, if several are stacked),
    from /proc/self/mountinfo; None if nothing is."""
    target = os.path.normpath(str(path))
    found = None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if unescape(fields[4]) == target:
                    found = fields[2]
    except OSError:
        pass
    return found


def mounts_under(path: str | Path) -> list[str]:
    """The mount points at ``path`` or below it, deepest first (to unmount in order)."""
    top = os.path.normpath(str(path))
    found = set()
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                mp = unescape(line.split()[4])
                if mp == top or mp.startswith(top + "/"):
                    found.add(mp)
    except OSError:
        pass
    return sorted(found, key=lambda m: (-m.count("/"), m))


def is_mounted(path: str | Path) -> bool:
    return mount_device(path) is not None


def umount(path: str | Path, lazy: bool = False) -> None:
    """``umount2(path)``; ``lazy`` detaches now and lets the kernel finish when the last
    user lets go. Raises ``OSError`` with the errno (EBUSY, EINVAL, ...)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(os.fsencode(str(path)), MNT_DETACH if lazy else 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount {path}: {os.strerror(err)}")


def mount_tmpfs(path: str | Path, size: int, mode: int = 0o755) -> None:
    """A tmpfs of ``size`` bytes at ``path`` (``nosuid,nodev,noexec``): whatever a user may
    write there fills it, not the file system around it. Raises ``OSError`` (root only)."""
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"size={size},mode={mode:o}".encode()
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    if libc.mount(b"bootseer", os.fsencode(str(path)), b"tmpfs", flags, options) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs on {path}: {os.strerror(err)}")


def unmount_stale(mountpoint: str | Path) -> None:
    """Detach a mount a crashed daemon left behind ("Transport endpoint is not connected")."""
    try:
        os.stat(mountpoint)
        if not os.path.ismount(mountpoint):
            return
    except OSError as exc:
        if exc.errno != errno.ENOTCONN:
            return
    with contextlib.suppress(OSError):
        umount(mountpoint, lazy=True)


def set_read_ahead(path: str | Path, kib: int) -> bool:
    """Set the kernel's read-ahead for the mount at ``path``; False if it could not.

    FUSE starts at 128 KiB, which also caps each read request; every request is a round
    trip into Python, so larger ones read sequentially several times faster.
    """
    dev = mount_device(path)
    if dev is None or kib <= 0:
        return False
    try:
        Path(f"/sys/class/bdi/{dev}/read_ahead_kb").write_text(str(kib))
    except OSError:
        return False
    return True


def raise_read_ahead_when_ready(mountpoint: str | Path, kib: int, timeout: float = 10.0) -> bool:
    """:func:`set_read_ahead` once the mount answers: the FUSE INIT reply resets it, so a
    daemon that mounts itself calls this from a thread while it serves."""
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if is_mounted(mountpoint):
            with contextlib.suppress(OSError):
                os.stat(mountpoint)  # answered only after INIT
                if set_read_ahead(mountpoint, kib):
                    return True
        time.sleep(0.05)
    return False
