"""Time bootseer's restore of a snapshot from a file:// store on local disk (bytes local).

python restore_local.py STORE_URI SCOPE KEY LINK_ROOT...
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "lib"))

from bootseer.deps.restore import RestoreRequest, read_manifest, restore
from bootseer.store import open_store


def main(argv: list[str]) -> int:
    uri, scope, key, *roots = argv
    store = open_store(uri)
    t0 = time.monotonic()
    found = read_manifest(store, scope, key, max_bytes=1 << 40, max_files=10**7, keys=None)
    assert found is not None, f"no snapshot {scope}/{key} in {uri}"
    m, _ = found
    restore(
        store,
        m,
        RestoreRequest(
            prefix=m.prefix,
            uid=os.getuid(),
            gid=os.getgid(),
            link_roots=roots,
            max_bytes=1 << 40,
            max_files=10**7,
        ),
    )
    print(f"BENCH local {time.monotonic() - t0:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
