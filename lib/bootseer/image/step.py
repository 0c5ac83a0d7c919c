"""The image steps of the Prolog and Epilog.

This first version checks that the image the job named is a squashfs file the job's
user may read and hands its path to the job as ``BOOTSEER_IMAGE``. Lazy loading and
hot-block prefetch through the node agent replace the hand-over.
"""

from __future__ import annotations

import os
import stat

from bootseer.errors import StepError
from bootseer.hooks.steps import StepCall, StepResult

SQUASHFS_MAGIC = b"hsqs"


def user_may_read(st: os.stat_result, uid: int, gid: int) -> bool:
    """Whether ``uid``/``gid`` may read a file with this stat (root's own checks do not apply)."""
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IRUSR)
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IRGRP)
    return bool(st.st_mode & stat.S_IROTH)


def check_image_file(path: str, uid: int, gid: int) -> os.stat_result:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise StepError(f"image {path} does not exist") from None
    except OSError as exc:
        raise StepError(f"cannot open image {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StepError(f"image {path} is not a regular file")
        if not user_may_read(st, uid, gid):
            raise StepError(f"image {path} is not readable by uid {uid}")
        if os.pread(fd, 4, 0) != SQUASHFS_MAGIC:
            raise StepError(f"image {path} is not a squashfs file (no 'hsqs' magic)")
        return st
    finally:
        os.close(fd)


def prolog(call: StepCall) -> StepResult:
    image = call.ctx.options.image
    assert image is not None
    if not image.startswith("/"):
        raise StepError(f"registered image {image!r}: no node agent on this node to serve it")
    st = check_image_file(image, call.ctx.uid, call.ctx.gid)
    return StepResult(detail=f"image {image} ({st.st_size} bytes)", env={"BOOTSEER_IMAGE": image})


def epilog(call: StepCall) -> StepResult:
    return StepResult(outcome="skipped", detail="no trace to save without the node agent")
