"""Waiting on a condition instead of sleeping: a test that synchronises with another
process or thread (a daemon, a kill landing, the kernel releasing a file) asks for what
it waits for, with a deadline, and fails naming it.

    >>> wait_until(lambda: log.exists(), "the daemon's log")  # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T], what: str, timeout: float = 30.0, interval: float = 0.02
) -> T:
    """``condition()``'s first truthy value, polled every ``interval`` seconds; an
    ``AssertionError`` naming ``what`` when ``timeout`` passes first (a generous one:
    the deadline is never a speed claim, only a bound on a hang)."""
    deadline = time.monotonic() + timeout
    while True:
        got = condition()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s")
        time.sleep(interval)
