"""Progress on long work (`pub --payload-file`, `pub --count`, `sub --out`): bytes, rate
and ETA, or events per second, on stderr, so stdout stays the command's output. Shown
only on a terminal and without --quiet: a pipe or a log gets the final line alone."""

from __future__ import annotations

from contextlib import contextmanager

from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn,
                           TimeRemainingColumn, TransferSpeedColumn)
from rich.text import Text


class RateColumn(ProgressColumn):
    """Events per second."""

    def render(self, task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} events/s" if speed is not None else "- events/s", style="progress.data.speed")


def shown(quiet: bool, console: Console) -> bool:
    return not quiet and console.is_terminal


@contextmanager
def progress(quiet: bool, kind: str = "bytes"):
    """A rich Progress on stderr, or None when it is not to be shown. `kind`: "bytes" or "events"."""
    console = Console(stderr=True)
    if not shown(quiet, console):
        yield None
        return
    if kind == "bytes":
        columns = [TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                   TimeRemainingColumn()]
    else:
        columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), RateColumn(),
                   TimeRemainingColumn()]
    with Progress(*columns, console=console, transient=False) as p:
        yield p
