"""bootseer: cut the time between "Slurm allocated the nodes" and "training does useful work".

The public surface is small: job-side phase marks; everything else is reached
through the ``bootseer`` command and the Slurm hooks::

    import bootseer

    with bootseer.phase("ckpt_load"):
        load_checkpoint()

``import bootseer`` stays cheap: the marks load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "mark", "phase"]

if TYPE_CHECKING:
    from bootseer.phases.marks import mark, phase


def __getattr__(name: str) -> Any:
    if name in ("phase", "mark"):
        from bootseer.phases import marks

        return getattr(marks, name)
    raise AttributeError(f"module 'bootseer' has no attribute {name!r}")
