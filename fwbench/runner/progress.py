"""Sweep progress: a rich progress bar (cell count, ETA) on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from fwbench.runner.manager import CellOutcome, Listener
from fwbench.units import format_seconds


def describe(outcome: CellOutcome) -> str:
    """One line about a finished cell."""
    text = f"{outcome.case.label()}: {outcome.status}"
    median = outcome.fields.get("median_s")
    if median is not None:
        text += f" {format_seconds(median)}"
    if outcome.reason:
        text += f" ({outcome.reason})"
    return text


@contextmanager
def sweep_progress(total: int, stream: IO[str] | None = None) -> Iterator[Listener]:
    """A listener that reports each finished cell; a live bar when ``stream`` is a terminal."""
    stream = stream or sys.stderr
    if not stream.isatty():
        count = 0

        def plain(outcome: CellOutcome) -> None:
            nonlocal count
            count += 1
            print(f"[{count}/{total}] {describe(outcome)}", file=stream, flush=True)

        yield plain
        return
    console = Console(file=stream)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False, refresh_per_second=2) as progress:
        task = progress.add_task("cells", total=total)

        def live(outcome: CellOutcome) -> None:
            progress.console.print(escape(describe(outcome)))
            progress.advance(task)

        yield live
