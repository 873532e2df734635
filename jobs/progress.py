"""Progress display for long jobs (rich), quiet when stderr is not a terminal."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

console = Console(stderr=True)


@contextmanager
def progress_bar(description: str, total: int | None, unit: str = "items") -> Iterator[Callable[[int], None]]:
    """Yields `advance(n)`; draws a bar on a terminal, prints nothing otherwise."""
    columns = [SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn(unit), TimeElapsedColumn()]
    with Progress(*columns, console=console, disable=not sys.stderr.isatty(), transient=False) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n=1: progress.advance(task, n)


@contextmanager
def stage(description: str) -> Iterator[None]:
    """A named step of a job: a spinner on a terminal, a log line otherwise."""
    if sys.stderr.isatty():
        with console.status(f"[bold]{description}…"):
            yield
    else:
        console.log(description)
        yield
    console.log(f"[green]done[/green] {description}")
