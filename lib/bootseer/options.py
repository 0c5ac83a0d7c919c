"""The syntax of the ``--bootseer*`` job options.

The SPANK plugin (spank/bootseer.c) checks the same syntax at submit time so a bad
value fails ``sbatch``; this module is the reference, and the prolog checks again
because the prolog runs as root and trusts nothing.

``--bootseer[=MODE]``
    ``on`` (the default when no value is given): use what earlier runs recorded and
    record what is missing. ``refresh``: ignore earlier traces and snapshots and record
    anew. ``off``: bootseer does nothing for this job.
``--bootseer-image=IMAGE``
    An absolute path to a squashfs image (``/shared/images/pytorch.sqsh``), or the name
    of a registered image, ``NAME[:TAG]`` (``pytorch:24.05``).
``--bootseer-deps=SPEC``
    ``PREFIX[,key=FILE]...[,scope=user|account|cluster]``: the absolute node-local
    directory the job installs its dependencies into, the files whose contents decide
    whether a snapshot fits (absolute, or relative to the job's working directory),
    and who may share the snapshot (the site config may forbid wider scopes).
``--bootseer-ckpt=SPEC``
    ``NAMESPACE``: a relative name (``team/llama-25b``) of the job's user's striped
    checkpoint namespace; the prolog mounts it at the path in ``$BOOTSEER_CKPT``.

Values use only ``A-Z a-z 0-9 . _ - / + @ :`` (and ``,`` and ``=`` as separators),
and no path component is ``.`` or ``..``.

    >>> parse_deps("/tmp/venv,key=requirements.txt")
    DepsSpec(prefix='/tmp/venv', keys=('requirements.txt',), scope='user')
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args

from bootseer.choices import one_of
from bootseer.errors import OptionError

Mode = Literal["on", "off", "refresh"]
MODES: tuple[Mode, ...] = get_args(Mode)
# Who may share a dependency snapshot (deps.scopes: which of them the site allows).
Scope = Literal["user", "account", "cluster"]
SCOPES: tuple[Scope, ...] = get_args(Scope)
MAX_PATH = 1024
_PATH_CHARS = re.compile(r"^[A-Za-z0-9._/+@:-]+$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}(:[A-Za-z0-9._-]{1,128})?$")
_NAMESPACE = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")


@dataclass(frozen=True)
class DepsSpec:
    prefix: str
    keys: tuple[str, ...] = ()
    scope: Scope = "user"


@dataclass(frozen=True)
class Options:
    """What the job asked for; ``mode`` is ``off`` when it asked for nothing."""

    mode: Mode = "off"
    image: str | None = None
    deps: DepsSpec | None = None
    ckpt: str | None = None

    @property
    def enabled(self) -> bool:
        return self.mode != "off"


def parse_mode(value: str | None) -> Mode:
    value = value or "on"
    mode = one_of(value, MODES)
    if mode is None:
        raise OptionError(f"--bootseer={value!r}: MODE must be one of {', '.join(MODES)}")
    return mode


def _check_path(option: str, value: str, absolute: bool) -> str:
    if not value or len(value) > MAX_PATH:
        raise OptionError(f"{option}: a path of 1 to {MAX_PATH} characters is required")
    if not _PATH_CHARS.fullmatch(value):
        raise OptionError(f"{option}={value!r}: only A-Z a-z 0-9 . _ - / + @ : are allowed")
    if absolute and not value.startswith("/"):
        raise OptionError(f"{option}={value!r}: must be an absolute path")
    if any(part in (".", "..") for part in value.split("/")):
        raise OptionError(f"{option}={value!r}: '.' and '..' are not allowed in paths")
    return value


def parse_image(value: str) -> str:
    if value.startswith("/"):
        return _check_path("--bootseer-image", value, absolute=True)
    if not _NAME.fullmatch(value):
        raise OptionError(
            f"--bootseer-image={value!r}: give an absolute path to a squashfs file or a "
            "registered image NAME[:TAG] (NAME: a-z 0-9 . _ -)"
        )
    return value


def parse_deps(value: str) -> DepsSpec:
    opt = "--bootseer-deps"
    first, *rest = value.split(",")
    if first.startswith("prefix="):
        first = first.removeprefix("prefix=")
    prefix = _check_path(opt + " prefix", first, absolute=True)
    if prefix == "/":
        raise OptionError(f"{opt}: the prefix must not be /")
    keys: list[str] = []
    scope: Scope = "user"
    for item in rest:
        name, eq, val = item.partition("=")
        if not eq:
            raise OptionError(f"{opt}: {item!r} is not NAME=VALUE (names: key, scope)")
        if name == "key":
            keys.append(_check_path(opt + " key", val, absolute=False))
        elif name == "scope":
            asked = one_of(val, SCOPES)
            if asked is None:
                raise OptionError(f"{opt}: scope must be one of {', '.join(SCOPES)}, not {val!r}")
            scope = asked
        else:
            raise OptionError(f"{opt}: unknown field {name!r} (fields: key, scope)")
    return DepsSpec(prefix=prefix.rstrip("/"), keys=tuple(keys), scope=scope)


def parse_ckpt(value: str) -> str:
    if (
        len(value) > 256
        or not _NAMESPACE.fullmatch(value)
        or any(p in (".", "..") for p in value.split("/"))
    ):
        raise OptionError(
            f"--bootseer-ckpt={value!r}: NAMESPACE is a relative name of A-Z a-z 0-9 . _ - "
            "parts joined by '/', without '.' or '..', up to 256 characters"
        )
    return value


def parse_options(
    mode: str | None, image: str | None, deps: str | None, ckpt: str | None
) -> Options:
    """Options from raw values; any of the value options alone implies ``--bootseer``."""
    asked = mode is not None or any(v is not None for v in (image, deps, ckpt))
    if not asked:
        return Options()
    return Options(
        mode=parse_mode(mode),
        image=parse_image(image) if image is not None else None,
        deps=parse_deps(deps) if deps is not None else None,
        ckpt=parse_ckpt(ckpt) if ckpt is not None else None,
    )
