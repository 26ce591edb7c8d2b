"""The signals that stopped the current command, wherever they were caught.

The command line's handler (``cli/app.py``) stops a command at the first Ctrl-C or SIGTERM and
ignores the later ones, so that they cannot cut the cleanup short (the partial run's last rows,
its run.json, the line that says where it is kept). A replay catches the first one itself (its
event loop's handler, or the handler that forwards it to the worker processes or Ray actors) and
puts the command line's handler back once it has stopped; each of them notes the signal here, so
that a second Ctrl-C arriving after that is known as a later one and ignored. It was taken for the
first: its KeyboardInterrupt cut the replay's cleanup, and the command exited 130 without saying
where the partial run was kept (a replay sent three Ctrl-Cs 50 ms apart on a loaded machine).
"""

from __future__ import annotations

#: the signals noted since the command started (cleared by the command line at each start)
STOPPED: list[int] = []


def note(signum: int) -> None:
    """A signal stopped (is stopping) the current command."""
    STOPPED.append(signum)
