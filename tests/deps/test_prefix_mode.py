"""A restored prefix gets the mode its owner gave it at capture (less write bits for
others): a prefix kept 0700 to hide the files in it stays 0700 on every node."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from bootseer.deps import step
from bootseer.deps.manifest import Manifest
from bootseer.errors import ManifestError
from bootseer.store import Store

from .conftest import USER_A, needs_root, site, step_call
from .test_steps import installed

pytestmark = pytest.mark.root


def _call(scratch: Path, job_id: int, node: str, prefix: Path):  # type: ignore[no-untyped-def]
    return step_call(
        scratch,
        site(scratch),
        job_id=job_id,
        uid=USER_A,
        user="ada",
        deps=f"{prefix},key=req.txt",
        node=node,
        nodes=(node,),
    )


@pytest.mark.parametrize(
    ("captured", "restored"), [(0o700, 0o700), (0o750, 0o750), (0o2751, 0o751)]
)
def test_the_prefix_mode_survives_capture_and_restore(
    scratch: Path, store: Store, captured: int, restored: int
) -> None:
    needs_root()
    (scratch / "req.txt").write_text("numpy\n")
    prefix = scratch / "env"
    first = _call(scratch, 1, "n1", prefix)
    assert step.prolog(first).outcome == "skipped"
    installed(first, prefix)
    os.chmod(prefix, captured)
    assert step.epilog(first).outcome == "ok"
    shutil.rmtree(prefix)
    r = step.prolog(_call(scratch, 2, "n2", prefix))
    assert r.outcome == "ok" and "restored" in r.detail, r.detail
    assert stat.S_IMODE(os.lstat(prefix).st_mode) == restored


def test_a_manifest_without_a_mode_restores_0755_and_a_bad_mode_is_refused() -> None:
    m = Manifest(
        key="0" * 32,
        base="1" * 32,
        scope="user/ada",
        prefix="/tmp/v",
        data="data-0123456789abcdef.tar.zst",
        frames=[],
        entries=[],
    )
    raw = m.to_json()
    assert b'"mode":493' in raw
    old = raw.replace(b',"mode":493', b"")
    assert Manifest.from_json(old, max_bytes=1, max_files=1).mode == 0o755
    with pytest.raises(ManifestError, match="not a file mode"):
        Manifest.from_json(raw.replace(b'"mode":493', b'"mode":99999'), max_bytes=1, max_files=1)
