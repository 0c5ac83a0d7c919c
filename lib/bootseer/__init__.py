"""bootseer: cut the time between "Slurm allocated the nodes" and "training does useful work".

The public surface is small: job-side phase marks; everything else is reached
through the ``bootseer`` command and the Slurm hooks::

    import bootseer

    with bootseer.phase("ckpt_load"):
        load_checkpoint()

``import bootseer`` stays cheap: the marks load on first use.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__", "mark", "phase"]

TYPE_CHECKING = False  # not typing's: a mark from a job script pays for every import
if TYPE_CHECKING:
    from typing import Any

    from bootseer.phases.marks import mark, phase


def __getattr__(name: str) -> Any:
    if name in ("phase", "mark"):
        from bootseer.phases import marks

        return getattr(marks, name)
    raise AttributeError(f"module 'bootseer' has no attribute {name!r}")
