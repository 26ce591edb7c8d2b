"""A live line on stderr while a step of unknown length runs: a spinner, what it is doing, the time so far.

For the steps that give no count to draw a bar from (a simulation, building
a report). Transient and on stderr, so stdout stays clean for ``--format
json`` and a finished command leaves only its output; shown only on a
terminal. Rich's progress module loads only when a line is drawn: the commands import this
module at their top, so their ``--help`` would pay for it otherwise (tests/test_cli_startup.py).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from rich.console import Console


@contextmanager
def working(console: Console, text: str) -> Iterator[None]:
    if not console.is_terminal:        # nothing live into a pipe or a file, not even a blank line
        yield
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                  transient=True) as bar:
        bar.add_task(text, total=None)
        yield
