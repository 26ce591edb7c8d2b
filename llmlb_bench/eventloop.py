"""The event loop the replayer, the no-op server and ``llmlb serve`` run on.

uvloop is a core dependency wherever it has wheels (CPython on Linux and
macOS): measured in docs/replay.md, it gives the replayer about a fifth more
capacity and halves its send lateness at p99 against asyncio's own loop.
Elsewhere (Windows, PyPy) asyncio's loop is used; every run records which
one ran (run.json ``summary.client.event_loop``), because the figures depend
on it. ``LLMLB_EVENT_LOOP=asyncio`` forces asyncio's loop (to compare the two).
"""

from __future__ import annotations

import asyncio
import os


def new_event_loop() -> tuple[asyncio.AbstractEventLoop, str]:
    """A new loop and its name: ``"uvloop"`` when installed and not turned off, else ``"asyncio"``."""
    if os.environ.get("LLMLB_EVENT_LOOP", "").strip().lower() != "asyncio":
        try:
            import uvloop
        except ImportError:  # no wheel for this platform: asyncio's own loop
            pass
        else:
            return uvloop.new_event_loop(), "uvloop"
    return asyncio.new_event_loop(), "asyncio"
