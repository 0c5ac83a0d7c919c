"""One way to write sizes and ages, in every command and report.

Sizes are IEC (powers of 1024: ``KiB``, ``MiB``, ``GiB``, ``TiB``); ages and periods a
number and one of ``s m h d w`` (``90s``, ``30m``, ``12h``, ``7d``, ``2w``), read and
written the same way::

    >>> iec(3 * 2**20 // 2)
    '1.5 MiB'
    >>> parse_size("500G") == 500 * 2**30
    True
    >>> parse_age("12h"), age(36 * 3600)
    (43200.0, '1.5d')
"""

from __future__ import annotations

import re

IEC = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_AGE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGTP]?)(?:i?B)?$", re.IGNORECASE)


class UnitError(ValueError):
    """A size or age that does not parse; the message says what is wanted."""


def iec(n: float) -> str:
    """``n`` bytes in IEC units, at most 4 significant characters before the unit."""
    value = float(n)
    for unit in IEC:
        if abs(value) < 1024 or unit == IEC[-1]:
            if unit == "B":
                return f"{value:.0f} B"
            return f"{value:.1f} {unit}" if abs(value) < 100 else f"{value:.0f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def parse_size(text: str) -> int:
    """``500G``, ``500GiB``, ``1.5T``, ``4096``: bytes (the letters are IEC: G = GiB)."""
    m = _SIZE.match(text.strip())
    if not m:
        raise UnitError(f"bad size {text!r}: want a number and K, M, G, T or P (IEC), e.g. 500G")
    power = " KMGTP".index(m.group(2).upper() or " ")
    return int(float(m.group(1)) * 1024**power)


def parse_age(text: str) -> float:
    """``7d`` -> seconds."""
    m = _AGE.match(text.strip())
    if not m:
        raise UnitError(f"bad age {text!r}: want a number and s, m, h, d or w (e.g. 7d, 12h)")
    return float(m.group(1)) * AGE_UNITS[m.group(2)]


def age(seconds: float) -> str:
    """``seconds`` in the largest unit that keeps the number at 1 or more (``12h``)."""
    s = max(0.0, seconds)
    for unit in ("w", "d", "h", "m"):
        if s >= AGE_UNITS[unit]:
            v = s / AGE_UNITS[unit]
            return f"{v:.0f}{unit}" if v >= 10 or v == int(v) else f"{v:.1f}{unit}"
    return f"{s:.0f}s"


def argparse_age(text: str) -> float:
    """An argparse ``type=``: an age in seconds, or argparse's own error."""
    import argparse

    try:
        return parse_age(text)
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
