"""User-facing errors.

Anything a user can cause (a bad file, a bad flag, a bad spec) raises
:class:`UserError`. The CLI turns it into one line on stderr and exit code 2,
never a traceback. Internal bugs stay ordinary exceptions so they keep their
traceback.
"""

from __future__ import annotations

from pathlib import Path


class UserError(Exception):
    """A problem with the user's input, reported as ``<where>: <problem>``."""

    def __init__(self, problem: str, where: str | Path | None = None) -> None:
        self.problem = problem
        self.where = str(where) if where is not None else None
        super().__init__(self.line())

    def line(self) -> str:
        """The single line printed to the user."""
        return f"{self.where}: {self.problem}" if self.where else self.problem
