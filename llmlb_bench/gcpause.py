"""Keep the garbage collector's full passes out of processes that serve in real time.

CPython's collector scans everything a process holds on a full
(generation 2) pass, and a server that keeps per-request records grows
what there is to scan: at 500 requests/s the no-op benchmark server stopped
for 200-250 ms at a time, so every client looked that late at p99. Young
objects, where request-scoped reference cycles live and die, are still
collected by the cheap generation 0 and 1 passes; what survives them is
long-lived by then and is not scanned again.
"""

from __future__ import annotations

import gc

#: generation-1 passes between full passes: in effect, never
_NO_FULL_PASSES = 1 << 30


def pause_full_collections() -> None:
    """Collect once, move what exists now out of the collector's sight, and stop full passes."""
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, _NO_FULL_PASSES)
