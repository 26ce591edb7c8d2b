"""NumPy's transparent huge pages, off while a large report's figures are computed.

NumPy asks the kernel (``madvise(MADV_HUGEPAGE)``) to back every array of 4 MiB or more with
2 MiB pages. Where the kernel's ``defrag`` setting is ``madvise`` (the common default), a fault in
such an array compacts memory on the spot until a free 2 MiB page is found: on a machine whose
memory is fragmented by other jobs, the report over ten million rows spent 2.3-3.3 of its 7.7-9.3
CPU-seconds in the kernel that way, and 1.2-1.3 s with 4 KiB pages (docs/metrics.md, "Speed").
A report allocates its large arrays once each and reads them once or twice, so huge pages buy it
little; :func:`small_pages` turns NumPy's request off for the duration and puts back what was
there. Only NumPy's own allocations are touched (not DuckDB's, not Arrow's), only the process's
setting, only while the block runs, and never when the user chose with ``NUMPY_MADVISE_HUGEPAGE``
in the environment. The switch is NumPy's ``_set_madvise_hugepage`` (what that variable sets at
import); it is private, so a NumPy without it leaves the setting alone and the report runs as before.
"""

from __future__ import annotations

import importlib
import os
from contextlib import contextmanager
from typing import Callable, Iterator

#: where NumPy keeps the switch: NumPy 2 (``numpy._core``), then NumPy 1
_MODULES = ("numpy._core.multiarray", "numpy.core.multiarray")
#: the environment variable NumPy reads at import; when set, the user's choice stands
ENV = "NUMPY_MADVISE_HUGEPAGE"


def _switch() -> Callable[[bool], bool] | None:
    """NumPy's ``_set_madvise_hugepage(enabled) -> previous``, or None where this NumPy has none."""
    for name in _MODULES:
        try:
            switch: Callable[[bool], bool] | None = getattr(importlib.import_module(name), "_set_madvise_hugepage",
                                                            None)
        except ImportError:
            continue
        if switch is not None:
            return switch
    return None


@contextmanager
def small_pages() -> Iterator[None]:
    """NumPy's arrays allocated without the huge-page request inside the block, as before after it."""
    switch = None if ENV in os.environ else _switch()
    if switch is None:
        yield
        return
    before = switch(False)
    try:
        yield
    finally:
        switch(before)
