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


class PolicyError(UserError):
    """A policy broke its contract (a target out of range, no ``choose_pair`` for a disaggregated fleet).

    Raised by :class:`~llmlb_bench.policies.Router` (and exported there), defined here: the Router's
    module is compiled with the simulator's core (compiled_core.py), where a class becomes a mypyc
    native class; this one stays a plain Python exception in both cores (the sweep's worker
    processes pickle it back to the parent)."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem, "--policy")
