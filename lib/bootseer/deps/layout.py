"""Where snapshots live in the store.

::

    deps/<scope>/<key>/manifest.json          the commit point: written last
    deps/<scope>/<key>/data-<capture>.tar.zst  the archive the manifest names
    deps/<scope>/<key>/used                    last restore (seconds since the epoch)
    deps/<scope>/refs/<base>.json              base key -> snapshot key of the latest capture

``<scope>`` is ``user/NAME``, ``account/NAME`` or ``cluster``. Each capture writes
its archive under a name of its own and the manifest last, so two jobs capturing the
same key at once leave one complete snapshot (the last manifest wins, and the
archive it names is whole); gc removes archives no manifest names.

    >>> SnapshotPaths("user/ada", "0" * 32).manifest
    'deps/user/ada/00000000000000000000000000000000/manifest.json'
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

ROOT = "deps"
_KEY = re.compile(r"^[0-9a-f]{32}$")
_DATA = re.compile(r"^data-[0-9a-f]{16}\.tar\.zst$")


def is_key(text: str) -> bool:
    return bool(_KEY.match(text))


def is_data_name(text: str) -> bool:
    return bool(_DATA.match(text))


def new_data_name() -> str:
    return f"data-{uuid.uuid4().hex[:16]}.tar.zst"


@dataclass(frozen=True)
class SnapshotPaths:
    scope: str
    key: str

    @property
    def dir(self) -> str:
        return f"{ROOT}/{self.scope}/{self.key}"

    @property
    def manifest(self) -> str:
        return f"{self.dir}/manifest.json"

    @property
    def used(self) -> str:
        return f"{self.dir}/used"

    def data(self, name: str) -> str:
        return f"{self.dir}/{name}"


def ref_path(scope: str, base: str) -> str:
    return f"{ROOT}/{scope}/refs/{base}.json"
