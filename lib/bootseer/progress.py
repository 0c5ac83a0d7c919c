"""Progress bars for a person at a terminal; silence for everyone else (hooks, pipes, logs)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# tick(step): ``step`` more bytes done; tick(0, absolute): ``absolute`` bytes done in all.
Tick = Callable[..., None]


@contextmanager
def transfer_bar(what: str, total: int | None, quiet: bool = False) -> Iterator[Tick]:
    """A rich bar of bytes moved when stderr is a terminal (and not ``quiet``)."""
    if quiet or not sys.stderr.isatty():
        yield lambda *_: None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        transient=True,
    ) as bar:
        task = bar.add_task(what, total=total)

        def tick(step: int, absolute: int | None = None) -> None:
            if absolute is not None:
                bar.update(task, completed=absolute)
            else:
                bar.advance(task, step)

        yield tick
