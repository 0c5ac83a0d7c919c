"""bootseer: cut the time between "Slurm allocated the nodes" and "training does useful work".

The public surface is small: job-side phase marks (``bootseer.phase``) arrive with
the phase records; everything else is reached through the ``bootseer`` command and
the Slurm hooks.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
