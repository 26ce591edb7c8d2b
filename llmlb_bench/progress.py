"""A live line on stderr while a step of unknown length runs: a spinner, what it is doing, the time so far.

For the steps that give no count to draw a bar from (a simulation, building
a report). Transient and on stderr, so stdout stays clean for ``--format
json`` and a finished command leaves only its output; shown only on a
terminal.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


@contextmanager
def working(console: Console, text: str) -> Iterator[None]:
    if not console.is_terminal:        # nothing live into a pipe or a file, not even a blank line
        yield
        return
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                  transient=True) as bar:
        bar.add_task(text, total=None)
        yield
