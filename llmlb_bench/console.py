"""Where the tool's consoles and tables are made, so that what it prints survives a pipe.

Rich measures the terminal to lay out a table; when stdout is a file or a
pipe (every CI log) there is no terminal, Rich falls back to 80 columns and
cuts whatever does not fit with "…": rule texts, run names, flag names, the
very values a CI log is read for. The policy here, in one place:

- stdout that is not a terminal, with ``COLUMNS`` unset, is laid out
  :data:`PIPE_WIDTH` columns wide (``COLUMNS`` chooses another width; a
  terminal keeps its own). The same width is given to Typer's ``--help``.
- every table the tool prints is a :class:`Table`, whose cells fold (wrap
  inside a word) where they do not fit, instead of ending in "…" or being
  cropped, so no width, however narrow, loses a character of a value.

stderr keeps Rich's own measure: it carries progress bars and one-line
errors meant for the person at the terminal.
"""

from __future__ import annotations

import io
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator, TextIO

from rich.console import Console
from rich.table import Table as _RichTable

#: columns of stdout laid out for a file or a pipe (COLUMNS unset): wide enough for the report's
#: tables and every --help line, narrow enough for a CI log viewer
PIPE_WIDTH = 160


def stdout_width() -> int | None:
    """The width stdout is laid out at: None (Rich's measure) for a terminal or when COLUMNS is set,
    else :data:`PIPE_WIDTH`."""
    if os.environ.get("COLUMNS", "").isdigit() or _is_terminal(sys.stdout):
        return None
    return PIPE_WIDTH


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or unusual stream is no terminal
        return False


def stdout_console() -> Console:
    """The console for what a command prints as its answer."""
    return Console(width=stdout_width())


def file_console() -> Console:
    """A console that records what is printed for a file (``report -o``), laid out as a pipe is."""
    return Console(record=True, width=PIPE_WIDTH, file=io.StringIO())


def stderr_console() -> Console:
    """The console for errors, warnings and progress (Rich measures the terminal itself)."""
    return Console(stderr=True)


@contextmanager
def help_width() -> Iterator[None]:
    """Lay out Typer's --help at :func:`stdout_width` while a command runs. Typer reads the width
    from ``TERMINAL_WIDTH`` when it first imports its help renderer (only for --help, so set here
    rather than imported at every start) and from ``MAX_WIDTH`` after; a ``TERMINAL_WIDTH`` the
    user set still wins. Both are put back afterwards (commands run in-process in tests)."""
    width = stdout_width()
    if width is None or "TERMINAL_WIDTH" in os.environ:
        yield
        return
    rich_utils = sys.modules.get("typer.rich_utils")
    before = getattr(rich_utils, "MAX_WIDTH", None)
    os.environ["TERMINAL_WIDTH"] = str(width)
    if rich_utils is not None:
        rich_utils.MAX_WIDTH = width  # type: ignore[attr-defined]  # typer's module constant, set for this command
    try:
        yield
    finally:
        os.environ.pop("TERMINAL_WIDTH", None)
        rich_utils = sys.modules.get("typer.rich_utils")  # perhaps imported meanwhile, reading the variable
        if rich_utils is not None:
            rich_utils.MAX_WIDTH = before  # type: ignore[attr-defined]


class Table(_RichTable):
    """A Rich table whose cells never lose characters: a column's overflow is ``fold`` unless the
    caller chooses another, and a folding column may wrap (Rich crops a ``no_wrap`` cell that does
    not fit without any mark, which is worse than "…")."""

    def add_column(self, *args: Any, **kwargs: Any) -> None:      # Any: Rich's own arguments, passed on
        kwargs.setdefault("overflow", "fold")
        if kwargs["overflow"] == "fold":
            kwargs["no_wrap"] = False
        super().add_column(*args, **kwargs)
