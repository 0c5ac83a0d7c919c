"""NumPy declared absent in bootseer's own processes, so that pyarrow does not load it.

pyarrow imports NumPy whenever it is installed (its ``lib`` module tries to, for its
NumPy conversions), which is half of what importing ``pyarrow.fs`` costs: 0.09 of 0.15
CPU-s here, in every prolog, epilog, background flush and checkpoint daemon, per job
and node. None of them converts to or from NumPy, so their entry points call
:func:`without_numpy` first; pyarrow then runs as where NumPy is not installed (which
pyarrow >= 18 supports). A process that uses NumPy (``bootseer report --plot``, through
matplotlib) must not call it.

    >>> import sys
    >>> without_numpy()  # doctest: +SKIP
    >>> sys.modules["numpy"] is None  # doctest: +SKIP
    True
"""

from __future__ import annotations

import sys


def without_numpy() -> None:
    """Make ``import numpy`` fail with ``ImportError`` in this process from now on,
    unless it was imported already (then nothing changes)."""
    sys.modules.setdefault("numpy", None)  # type: ignore[arg-type]
