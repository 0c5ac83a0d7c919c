"""Progress bars for a person at a terminal; silence for everyone else (hooks, pipes, logs)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import ProgressColumn

# tick(step): ``step`` more bytes done; tick(0, absolute): ``absolute`` bytes done in all.
Tick = Callable[..., None]


@contextmanager
def transfer_bar(what: str, total: int | None, quiet: bool = False) -> Iterator[Tick]:
    """A rich bar of bytes moved when stderr is a terminal (and not ``quiet``)."""
    if quiet or not sys.stderr.isatty():
        yield lambda *_: None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(binary_units=True),  # IEC, as everywhere (bootseer.units)
        _iec_speed_column(),
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


def _iec_speed_column() -> ProgressColumn:
    """rich's TransferSpeedColumn in IEC units (its own says MB/s)."""
    from rich.progress import ProgressColumn, Task
    from rich.text import Text

    from bootseer.units import iec

    class IECSpeed(ProgressColumn):
        def render(self, task: Task) -> Text:
            speed = task.finished_speed or task.speed
            return Text("?" if speed is None else f"{iec(speed)}/s", style="progress.data.speed")

    return IECSpeed()
