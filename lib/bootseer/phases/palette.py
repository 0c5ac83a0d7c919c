"""One colour, and one glyph, per phase: the terminal report and the pictures agree.

Standard phases (:data:`bootseer.phases.schema.PHASE_ORDER`) keep their colour from
report to report; other phase names take the next free ones in the order given. The
colours are hex (matplotlib's ``tab20`` set, which rich shows as the nearest colour the
terminal has); the glyphs tell phases apart where there is no colour (``NO_COLOR``,
output to a file)::

    >>> palette = phase_palette(["prolog", "my_phase"])
    >>> palette["prolog"].color, palette["prolog"].glyph
    ('#1f77b4', '#')
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from bootseer.phases.schema import PHASE_ORDER

COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#c7c7c7",
    "#dbdb8d",
    "#9edae5",
)
GLYPHS = "#=+%@*o~x^&$:!?<>/\\|"


@dataclass(frozen=True)
class Swatch:
    color: str  # "#rrggbb"
    glyph: str  # one character, for output without colour


def phase_palette(phases: Iterable[str]) -> dict[str, Swatch]:
    """A swatch for each of ``phases``: standard ones fixed, others in order."""
    out: dict[str, Swatch] = {}
    used: set[int] = set()
    names = list(dict.fromkeys(phases))
    for name in names:
        if name in PHASE_ORDER:
            i = PHASE_ORDER.index(name) % len(COLORS)
            out[name] = Swatch(COLORS[i], GLYPHS[i % len(GLYPHS)])
            used.add(i)
    free = [i for i in range(len(COLORS)) if i not in used] or list(range(len(COLORS)))
    for k, name in enumerate(n for n in names if n not in out):
        i = free[k % len(free)]
        out[name] = Swatch(COLORS[i], GLYPHS[i % len(GLYPHS)])
    return out
